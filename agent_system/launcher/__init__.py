"""The launcher: start-up (``python -m verl.trainer.main_mlmt``), the run plan and its memory estimate, the device
checks, the console and checkpoint export. It builds the levels, runs the loop and checks the plan after it."""
