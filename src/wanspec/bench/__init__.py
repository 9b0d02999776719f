"""Experiments on the simulator: `wanspec bench NAME --config tiny|quick|full --out DIR`.

runner       cells, settings hashes, the resumable JSONL sweep (tqdm progress)
config       the tiny / quick / full configurations
datasets     prompt sets (shared JSONL data by name or path; bundled `mini-*` sets)
experiment   what an experiment is; generation cells, intervals, the synthetic pair
xcosd        X-CoSD's experiments: xcosd-bits, xcosd-rate, quality, analysis
acespec      AceSpec's experiments: acespec-table1, -bandwidth, -ablation, -budget, -temperature
capacity     edges per cloud: capacity, capacity-real
registry     every experiment by name, assembled once (the order of `wanspec bench list`)
tables       rows as Markdown tables
accounting   X-CoSD's bit accounting, recomputed from each run's events
metrics      BLEU, ROUGE-2, exact match, bootstrap intervals
sweep        run an experiment into a folder; results.csv, table.md, figures
report       docs/RESULTS.md from everything under an output directory
demo         `wanspec demo`
"""
