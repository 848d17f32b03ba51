"""The results store: one folder per (model, method, task, length) cell, written by the runner and read by the
reports (`store`), and the provenance recorded with every result (`provenance`). No torch."""
