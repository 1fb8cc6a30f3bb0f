"""LoRA adapters of served base models: their files (``peft``) and their registry
(``registry``), addressed as ``base:adapter`` everywhere a model id goes."""
