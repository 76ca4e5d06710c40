"""The MMSearch-R1 evaluation: FVQA files, records with per-turn image/text search logs, and the table by data
source and category."""
