"""The `wanspec` command: version, method list, generate on tiny real models, clear errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from click.testing import CliRunner

from wanspec.cli import main
from wanspec.protocols.registry import METHODS


def test_console_script_prints_version() -> None:
    exe = shutil.which("wanspec") or f"{sys.prefix}/bin/wanspec"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("wanspec, version ")


def test_methods_lists_every_method_with_losslessness() -> None:
    result = CliRunner().invoke(main, ["methods", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r["lossless"] for r in json.loads(result.output)}
    assert rows == {name: m.lossless for name, m in METHODS.items()}
    assert rows["xcosd-e"] is True and rows["gr"] is False
    table = CliRunner().invoke(main, ["methods"]).output
    assert all(name in table for name in METHODS)


def test_methods_table_columns_align_for_names_with_aliases() -> None:
    header, *lines = CliRunner().invoke(main, ["methods"]).output.splitlines()
    assert len(lines) == len(METHODS)
    lossless_at, vocab_at = header.index("lossless"), header.index("vocabulary")
    for line, m in zip(lines, METHODS.values(), strict=True):
        name = m.name + (f" ({', '.join(m.aliases)})" if m.aliases else "")
        assert line[:lossless_at].rstrip() == name and line[lossless_at - 1] == " ", line
        assert line[lossless_at:vocab_at].rstrip() == ("yes" if m.lossless else "no"), line
        assert line[vocab_at - 1] == " " and line[vocab_at] != " ", line
    assert any(m.aliases for m in METHODS.values())  # the case that used to push columns right


def test_methods_describe_srdv_fallback_on_the_cloud_not_hr() -> None:
    output = CliRunner().invoke(main, ["methods", "--json"]).output
    rows = {r["name"]: r for r in json.loads(output)}
    for name in ("xcosd-e", "acespec-x"):
        description = rows[name]["description"]
        assert "HR" not in description and "p̃" in description, description


def test_generate_json_on_tiny_pair(tiny_pair_hetero) -> None:
    draft, target = tiny_pair_hetero
    args = [
        "generate",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--method",
        "xcosd",
        "--prompt",
        "hello world",
        "--temperature",
        "0",
        "--max-new-tokens",
        "6",
        "--bandwidth",
        "1e6",
        "--rtt",
        "0.1",
        "--json",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert len(payload["token_ids"]) == payload["stats"]["new_tokens"] == 6
    assert payload["stats"]["method"] == "xcosd"
    assert payload["stats"]["time_s"] >= 0.1


def test_generate_rejects_bad_method_and_settings(tiny_pair_shared) -> None:
    draft, target = tiny_pair_shared
    base = ["generate", "--target", str(target), "--draft", str(draft), "--prompt", "hi"]
    bad_method = CliRunner().invoke(main, [*base, "--method", "nope"])
    assert bad_method.exit_code != 0 and "unknown method" in bad_method.output
    bad_gamma = CliRunner().invoke(main, [*base, "--gamma", "0"])
    assert bad_gamma.exit_code != 0 and "gamma" in bad_gamma.output
    bad_link = CliRunner().invoke(main, [*base, "--bandwidth", "-5"])
    assert bad_link.exit_code != 0 and "bandwidth" in bad_link.output
    bad_bits = CliRunner().invoke(main, [*base, "--q-bits", "12"])
    assert bad_bits.exit_code != 0 and "q_bits" in bad_bits.output


def test_generate_q_bits_reaches_the_run(tiny_pair_shared) -> None:
    """--q-bits sets the precision of the q the cloud ships: 16-bit q costs fewer downlink
    bits than the default 32 on the same greedy run (same tokens, only the rounding differs)."""
    draft, target = tiny_pair_shared
    base = ["generate", "--target", str(target), "--draft", str(draft), "--prompt", "hello",
            "--method", "naive", "--max-new-tokens", "8", "--json"]  # fmt: skip
    runs = {bits: CliRunner().invoke(main, [*base, "--q-bits", bits]) for bits in ("16", "32")}
    stats = {bits: json.loads(r.output)["stats"] for bits, r in runs.items()}
    assert stats["16"]["tv_bound"] > stats["32"]["tv_bound"] >= 0


def test_generate_unknown_model_is_a_clear_error() -> None:
    result = CliRunner().invoke(main, ["generate", "--target", "no-such-model", "--prompt", "x"])
    assert result.exit_code != 0
    assert "no-such-model" in result.output
