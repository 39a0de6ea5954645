"""Reading results and writing reports, one role a module; each imports only those above it.

- load.py: finished runs from a results store, their aggregates over seeds, the optional per-run tables
- format.py: cells, rows, HTML and Markdown tables, leaderboard.md
- summary.py: the text tables of `clbench results` and `clbench run`, per task fitting 120 columns
- plots.py: the figures, as inline SVG
- paper.py: the paper's tables beside clbench's results (`clbench report --paper`)
- page.py: index.html
- leaderboard.py: `clbench leaderboard` (index.html, leaderboard.md, leaderboard.csv)
"""
