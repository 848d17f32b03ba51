"""The results store: one folder per (model, method, task, length) cell, written by the runner and read by the
reports (`store`), what a cell's fingerprint knows its inputs by (`digests`: cached content digests of files, learned
files read once, hub commits), and the provenance recorded with every result (`provenance`). No torch."""
