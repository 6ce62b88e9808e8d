"""Parsing edits the way models really write them."""

from __future__ import annotations

import orjson

from jsonlbatch.post import Edit, extract_edits

AGENTLESS = """<think>
The bug is in the separator handling. I need to change `split` to `rsplit`.
</think>

Based on the issue, the problem is in `utils/text.py`.

```python
### utils/text.py
<<<<<<< SEARCH
def last_part(value):
    return value.split(".")[-1]
=======
def last_part(value):
    return value.rsplit(".", 1)[-1]
>>>>>>> REPLACE
```

And a second fix in another file:

```python
### pkg/core.py
<<<<<<< SEARCH
import os
=======
import os
import sys
>>>>>>> REPLACE
<<<<<<< SEARCH
    return None
=======
    return sys.maxsize
>>>>>>> REPLACE
```
"""


def test_agentless_blocks_several_files_and_edits() -> None:
    found = extract_edits(AGENTLESS)
    assert found.problems == []
    assert found.edits == [
        Edit(
            "utils/text.py",
            'def last_part(value):\n    return value.split(".")[-1]\n',
            'def last_part(value):\n    return value.rsplit(".", 1)[-1]\n',
        ),
        Edit("pkg/core.py", "import os\n", "import os\nimport sys\n"),
        Edit("pkg/core.py", "    return None\n", "    return sys.maxsize\n"),
    ]


def test_aider_style_path_above_fence_long_markers_no_language() -> None:
    text = (
        "I'll make the change.\n\nsrc/app.js\n```\n<<<<<<<<< SEARCH\nconst x = 1;\n"
        "=========\nconst x = 2;\n>>>>>>>>> REPLACE\n```\n"
    )
    assert extract_edits(text).edits == [Edit("src/app.js", "const x = 1;\n", "const x = 2;\n")]


def test_replace_marker_glued_to_last_line_and_other_fence_language() -> None:
    text = (
        "```diff\n### lib/m.rb\n<<<<<<< SEARCH\n  puts 'a'\n=======\n  puts 'b'>>>>>>> REPLACE\n```"
    )
    assert extract_edits(text).edits == [Edit("lib/m.rb", "  puts 'a'\n", "  puts 'b'\n")]


def test_empty_search_creates_a_file() -> None:
    text = "```python\n### tests/test_new.py\n<<<<<<< SEARCH\n=======\ndef test_it():\n    assert True\n>>>>>>> REPLACE\n```"
    [edit] = extract_edits(text).edits
    assert (edit.path, edit.search, edit.replace) == (
        "tests/test_new.py", "", "def test_it():\n    assert True\n"
    )  # fmt: skip


def test_malformed_blocks_are_reported() -> None:
    no_path = "Here is the fix:\n```python\n<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n```"
    truncated = "```python\n### a.py\n<<<<<<< SEARCH\nold\n=======\nnew line that never ends"
    found = extract_edits(no_path)
    assert found.edits == [] and "no file path" in found.problems[0]
    found = extract_edits(truncated)
    assert found.edits == [] and "truncated" in found.problems[0]


def test_unified_diff_with_wrong_hunk_counts() -> None:
    text = """The fix:

```diff
diff --git a/pkg/core.py b/pkg/core.py
--- a/pkg/core.py
+++ b/pkg/core.py
@@ -10,7 +10,9 @@ def f():
 def g(x):
-    return x
+    if x is None:
+        return 0
+    return x

@@ -40,1 +42,1 @@
-VERSION = "1.0"
+VERSION = "1.1"
--- /dev/null
+++ b/pkg/new.py
@@ -0,0 +1,2 @@
+def new():
+    pass
```
"""
    found = extract_edits(text)
    assert found.problems == []
    assert found.edits == [
        Edit(
            "pkg/core.py",
            "def g(x):\n    return x\n",
            "def g(x):\n    if x is None:\n        return 0\n    return x\n",
            "diff",
            10,
        ),
        Edit("pkg/core.py", 'VERSION = "1.0"\n', 'VERSION = "1.1"\n', "diff", 42),
        Edit("pkg/new.py", "", "def new():\n    pass\n", "create"),
    ]


def test_str_replace_tool_calls() -> None:
    def call(**args: object) -> dict:
        return {
            "type": "function",
            "function": {"name": "str_replace_editor", "arguments": orjson.dumps(args).decode()},
        }

    calls = [
        call(command="view", path="/testbed/a.py"),
        call(command="str_replace", path="/testbed/a.py", old_str="x = 1", new_str="x = 2"),
        call(command="insert", path="a.py", insert_line=3, new_str="# note"),
        call(command="create", path="b.py", file_text="print('hi')\n"),
        {"type": "function", "function": {"name": "str_replace_editor", "arguments": "{oops"}},
    ]
    found = extract_edits("", calls)
    assert found.edits == [
        Edit("/testbed/a.py", "x = 1", "x = 2", "str_replace"),
        Edit("a.py", "", "# note\n", "insert", 3),
        Edit("b.py", "", "print('hi')\n", "create"),
    ]
    assert found.problems == ["tool call 4: arguments are not valid JSON"]
