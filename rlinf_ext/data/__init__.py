"""QA data preprocessing into RLinf prompt jsonl (`rlinf-ext preprocess`)."""
