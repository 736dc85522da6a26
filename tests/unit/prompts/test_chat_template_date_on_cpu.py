"""Prompts are the same bytes any day under a Llama-3-style chat template (issue 22, item 7).

Llama 3.x templates write "Today Date: <date>" into the system header from ``strftime_now`` unless a ``date_string``
is given. The day is changed by replacing the clock ``strftime_now`` reads (transformers' chat-template module); the
tokenizer, its template rendering and the project's PromptBuilder are real.
"""

import datetime as real_datetime

import pytest
import transformers.utils.chat_template_utils as chat_template_utils

from agent_system.config import compose_config
from agent_system.eval.math500 import RESULT_KEYS
from agent_system.models.tiny import build_tiny_tokenizer
from agent_system.prompts.templates import CHAT_TEMPLATE_DATE, PromptBuilder, Task

# the date logic and header of Llama 3.2's template, on the tiny tokenizer's vocabulary
LLAMA3_STYLE = (
    "{%- if not date_string is defined %}"
    "{%- if strftime_now is defined %}{%- set date_string = strftime_now('%d %b %Y') %}"
    "{%- else %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{%- endif %}"
    "<|im_start|>system\nCutting Knowledge Date: December 2023\nToday Date: {{ date_string }}<|im_end|>\n"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TASK = Task("What is 2 + 3?", "math", "5")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    tok = build_tiny_tokenizer(tmp_path_factory.mktemp("llama3_style"))
    tok.chat_template = LLAMA3_STYLE
    return tok


def _on_day(monkeypatch, day: real_datetime.datetime) -> None:
    class Clock(real_datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return day

    monkeypatch.setattr(chat_template_utils, "datetime", Clock)


def _solve_on_two_days(monkeypatch, tokenizer, builder):
    prompts = []
    for day in (real_datetime.datetime(2025, 3, 1), real_datetime.datetime(2026, 11, 25)):
        _on_day(monkeypatch, day)
        prompts.append(builder.solve(TASK, tokenizer, 512))
    return prompts


def test_default_prompts_are_the_same_bytes_on_two_days(monkeypatch, tokenizer):
    first, second = _solve_on_two_days(monkeypatch, tokenizer, PromptBuilder())
    assert first.ids == second.ids
    assert f"Today Date: {CHAT_TEMPLATE_DATE}" in tokenizer.decode(first.ids)


def test_without_a_date_string_the_template_prints_the_day(monkeypatch, tokenizer):
    # what every prompt did before: the control that the clock replacement reaches the template
    first, second = _solve_on_two_days(monkeypatch, tokenizer, PromptBuilder(chat_template_kwargs={}))
    assert first.ids != second.ids
    assert "Today Date: 01 Mar 2025" in tokenizer.decode(first.ids)
    assert "Today Date: 25 Nov 2026" in tokenizer.decode(second.ids)


def test_trainer_config_fixes_the_date_and_the_key_changes_it(monkeypatch, tokenizer):
    config = compose_config([])
    assert dict(config.data.apply_chat_template_kwargs) == {"date_string": CHAT_TEMPLATE_DATE}
    first, second = _solve_on_two_days(monkeypatch, tokenizer, PromptBuilder.from_config(config))
    assert first.ids == second.ids
    other = compose_config(["data.apply_chat_template_kwargs.date_string=01 Jan 2025"])
    prompt = PromptBuilder.from_config(other).solve(TASK, tokenizer, 512)
    assert "Today Date: 01 Jan 2025" in tokenizer.decode(prompt.ids)


def test_evaluator_records_the_date_in_its_config_json_keys():
    assert "chat_template_date" in RESULT_KEYS
