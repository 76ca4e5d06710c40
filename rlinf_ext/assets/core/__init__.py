"""Agent-independent tiny assets: the invented world and its corpus, tokenizer, model builders, file formats, the
shared SFT loop and playback stand-ins, and the ``make-tiny-assets`` entry (``tiny.make_tiny_assets``)."""
