"""The pure ML layer: scored trajectory groups → one GRPO update of a LoRA adapter → a checkpoint.

Never imports Django; the `training` app turns database rows into a TrainConfig and calls this.
Importing the package loads nothing: callers import the submodule they need, so the web process can
read `config` and `advantages` without paying for torch, which only `trainer` and what it uses load.
"""
