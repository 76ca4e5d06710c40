"""MMSearch-R1 (vision-language agent) tiny assets: emblems and FVQA questions, the VL tokenizer/processor and models,
scripted turns and the warm start."""
