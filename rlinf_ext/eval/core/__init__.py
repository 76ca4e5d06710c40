"""What every agent's evaluation shares: the resumable evaluation loop over generations.jsonl, the record base,
the result files and the run-level settings (run directory, decoding, concurrency, same-setup check)."""
