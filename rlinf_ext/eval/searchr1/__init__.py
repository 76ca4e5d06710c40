"""The Search-R1 evaluation: the seven QA benchmarks, EM / subEM / F1 records and tables, validation during
training, and the `eval-report` comparison with the published rows."""
