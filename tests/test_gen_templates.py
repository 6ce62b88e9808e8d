"""Prompt templates: sandboxed Jinja2 with StrictUndefined, errors that name the row and field."""

from __future__ import annotations

import pytest

from jsonlbatch.errors import InputError, UsageError
from jsonlbatch.gen.sources import Row
from jsonlbatch.gen.templates import Prompt, RowTemplate, compile_condition

ROW = Row("tasks.jsonl", 4, 5, {"id": "t4", "q": '1 < 2 & "x"?', "image": "http://h/i.png"})


def test_fields_row_and_row_index_are_variables():
    t = RowTemplate("{{ id }}|{{ row['q'] }}|{{ row_index }}")
    assert t.render(ROW) == 't4|1 < 2 & "x"?|4'
    shadowed = Row("d", 0, 1, {"row_index": "mine"})
    assert RowTemplate("{{ row_index }}").render(shadowed) == "mine"


def test_tojson_is_plain_json_not_html_escaped():
    assert RowTemplate("{{ q | tojson }}").render(ROW) == '"1 < 2 & \\"x\\"?"'


def test_missing_field_names_file_line_row_field_and_template_line():
    t = RowTemplate("Task {{ id }}\n\nSolve: {{ question }}\n", name="prompt.j2")
    with pytest.raises(InputError) as exc:
        t.render(ROW)
    text = str(exc.value)
    assert text.splitlines()[0] == "cannot render prompt.j2 (template line 3)"
    assert "tasks.jsonl:5: question: row 4: has no field 'question' (it has: id, q, image)" in text
    assert exc.value.problems[0].field == "question"


def test_missing_attribute_of_row_is_named_too():
    with pytest.raises(InputError, match="answer: row 4: has no field 'answer'"):
        RowTemplate("{{ row.answer }}").render(ROW)


def test_syntax_error_names_template_file_and_line():
    with pytest.raises(InputError) as exc:
        RowTemplate("ok\n\n{{ id }\n", name="p.j2")
    assert str(exc.value).startswith("bad template p.j2\n  p.j2:3:")


def test_sandbox_blocks_unsafe_access():
    t = RowTemplate("{{ id.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(InputError, match="row 4: SecurityError"):
        t.render(ROW)


def test_inline_escapes_and_file_templates(tmp_path):
    assert (
        RowTemplate.inline(r"Q: {{ id }}\nA:\t\\n", name="--prompt").render(ROW) == "Q: t4\nA:\t\\n"
    )
    p = tmp_path / "p.j2"
    p.write_text("Hello {{ id }}\n")
    assert RowTemplate.from_file(str(p)).render(ROW) == "Hello t4"  # one final newline dropped
    with pytest.raises(InputError, match=r"cannot read template .*nope\.j2"):
        RowTemplate.from_file(str(tmp_path / "nope.j2"))


def test_condition():
    assert compile_condition("id == 't4' and row_index > 3")(ROW) is True
    assert compile_condition("missing is defined")(ROW) is False
    with pytest.raises(InputError, match="cannot evaluate condition 'stars > 3'") as exc:
        compile_condition("stars > 3")(ROW)
    assert "stars: row 4: has no field 'stars'" in str(exc.value)
    with pytest.raises(UsageError, match="bad condition"):
        compile_condition("id ==")


def test_prompt_shapes():
    user = RowTemplate("Q {{ id }}")
    assert Prompt(user=user).build(ROW) == "Q t4"
    assert Prompt(user=user, system=RowTemplate("S {{ id }}")).build(ROW) == [
        {"role": "system", "content": "S t4"},
        {"role": "user", "content": "Q t4"},
    ]
    with pytest.raises(UsageError):
        Prompt()
    with pytest.raises(UsageError):
        Prompt(user=user, messages=user)
    with pytest.raises(UsageError, match="drop the system text"):
        Prompt(messages=user, system=user)


def test_messages_template_multi_turn_and_image_parts():
    source = """[
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [
        {"type": "text", "text": {{ q | tojson }}},
        {"type": "image_url", "image_url": {"url": {{ image | tojson }}}}]},
      {"role": "assistant", "content": "Let me see."},
      {"role": "user", "content": "Go on, {{ id }}."}
    ]"""
    messages = Prompt(messages=RowTemplate(source)).build(ROW)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[1]["content"][0]["text"] == ROW.data["q"]
    assert messages[1]["content"][1]["image_url"]["url"] == "http://h/i.png"


def test_messages_template_errors_name_the_row():
    bad_json = Prompt(messages=RowTemplate('[{"role": "user", "content": "{{ q }}"}]', name="m.j2"))
    with pytest.raises(InputError) as exc:
        bad_json.build(ROW)
    text = str(exc.value)
    assert text.startswith("m.j2 did not render a list of messages")
    assert "tasks.jsonl:5: row 4: not JSON" in text and "tojson" in text
    bad_role = Prompt(messages=RowTemplate('[{"role": "usr", "content": "hi"}]'))
    with pytest.raises(InputError, match=r"messages\[0\].role: row 4: unknown role 'usr'"):
        bad_role.build(ROW)
    with pytest.raises(InputError, match="messages: row 4: must be a list"):
        Prompt(messages=RowTemplate('{"role": "user"}')).build(ROW)
