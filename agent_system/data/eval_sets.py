"""The evaluation sets every run is checked against (agent_system.data.heldout), read from ``eval_sets.json``.

The file is generated, do not edit it; regenerate it with
``python -m agent_system.data.prepare --data ../shared/data --write-eval-sets``. It holds MATH-500's ``unique_id``
values, and 16-hex-digit SHA-1 hashes of the normalised problem text (``heldout.text_hash``) of MATH-500, GSM8K test
and MBPP test (task_ids 11-510, the text as the solver sees it).
"""

from __future__ import annotations

import json
from pathlib import Path

EVAL_SETS_FILE = Path(__file__).with_name("eval_sets.json")

_SETS = json.loads(EVAL_SETS_FILE.read_text(encoding="utf-8"))
MATH500_UNIQUE_IDS: frozenset[str] = frozenset(_SETS["MATH500_UNIQUE_IDS"])
MATH500_TEXT: frozenset[str] = frozenset(_SETS["MATH500_TEXT"])
GSM8K_TEST_TEXT: frozenset[str] = frozenset(_SETS["GSM8K_TEST_TEXT"])
MBPP_TEST_TEXT: frozenset[str] = frozenset(_SETS["MBPP_TEST_TEXT"])
