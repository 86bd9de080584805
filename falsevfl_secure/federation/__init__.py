"""FALSE-VFL on separately held tables: each party brings its own file, records are aligned privately,
and a trained federation predicts for any subset of parties (`python -m falsevfl_secure.federation`)."""
