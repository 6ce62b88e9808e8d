"""`post files --render`: JSON specs rendered into real office files, opened again with the same
libraries (and a PDF text extractor) to check their content; bad specs refused per file."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from postutil import chat_line, post, read_jsonl, write_jsonl

from jsonlbatch.post import extract_files
from jsonlbatch.post.render import SpecError, format_of, render, schema

openpyxl = pytest.importorskip("openpyxl", reason="the render extra is not installed")
docx = pytest.importorskip("docx", reason="the render extra is not installed")
pptx = pytest.importorskip("pptx", reason="the render extra is not installed")
pypdf = pytest.importorskip("pypdf", reason="pypdf (test extra) reads the PDFs back")

SHEET = {
    "sheets": [
        {
            "name": "Budget",
            "rows": [["Item", "Cost"], ["Rent", 1200], ["Food", 350.5], ["Total", "=SUM(B2:B3)"]],
            "column_widths": [18, None],
        },
        {"name": "Notes", "rows": [["ok", True, None]]},
    ]
}
DOC = {
    "title": "Quarterly memo",
    "blocks": [
        {"type": "heading", "text": "Summary", "level": 1},
        {"type": "paragraph", "text": "Revenue grew 12 % — see the table."},
        {"type": "bullets", "items": ["first point", "second point"]},
        {"type": "bullets", "items": ["step one"], "ordered": True},
        {"type": "table", "rows": [["Region", "Revenue"], ["North", 10], ["South", 12.5]]},
    ],
}
DECK = {
    "slides": [
        {"title": "Plan", "bullets": ["Hire", "Ship"], "notes": "say hello"},
        {"title": "Numbers", "bullets": ["up"], "table": {"rows": [["k", "v"], ["a", 1]]}},
    ]
}


def answer(*entries: dict) -> str:
    return "Here you go:\n```json\n" + json.dumps({"files": list(entries)}) + "\n```\n"


def test_xlsx_keeps_numbers_formulas_and_widths() -> None:
    book = openpyxl.load_workbook(io.BytesIO(render("b.xlsx", SHEET)))
    assert book.sheetnames == ["Budget", "Notes"]
    sheet = book["Budget"]
    assert sheet["B2"].value == 1200 and isinstance(sheet["B2"].value, int)
    assert sheet["B3"].value == 350.5
    assert sheet["B4"].value == "=SUM(B2:B3)" and sheet["B4"].data_type == "f"
    assert sheet.column_dimensions["A"].width == 18
    assert sheet["A1"].font.bold
    assert [c.value for c in book["Notes"][1]] == ["ok", True, None]


def test_docx_blocks_in_order() -> None:
    doc = docx.Document(io.BytesIO(render("m.docx", DOC)))
    texts = [(p.style.name, p.text) for p in doc.paragraphs]
    assert texts[0] == ("Title", "Quarterly memo")
    assert ("Heading 1", "Summary") in texts
    assert ("List Bullet", "second point") in texts and ("List Number", "step one") in texts
    table = doc.tables[0]
    assert [c.text for c in table.rows[2].cells] == ["South", "12.5"]


def test_pptx_slides_bullets_table_notes() -> None:
    deck = pptx.Presentation(io.BytesIO(render("d.pptx", DECK)))
    first, second = deck.slides
    assert first.shapes.title.text == "Plan"
    assert "Ship" in [p.text for p in first.placeholders[1].text_frame.paragraphs]
    assert first.notes_slide.notes_text_frame.text == "say hello"
    table = next(s for s in second.shapes if s.has_table).table
    assert table.cell(1, 0).text == "a" and table.cell(1, 1).text == "1"


def test_pdf_text_reads_back() -> None:
    reader = pypdf.PdfReader(io.BytesIO(render("m.pdf", DOC)))
    text = " ".join(page.extract_text() for page in reader.pages)
    for expected in ("Quarterly memo", "Summary", "Revenue grew 12", "second point", "South"):
        assert expected in text


def test_csv_and_md() -> None:
    assert render("t.csv", {"rows": [["a", "b,c"], [1, None], [True, 2.5]]}) == (
        b'a,"b,c"\n1,\nTRUE,2.5\n'
    )
    md = render("r.md", {"blocks": [{"type": "table", "rows": [["x|y", "z"], [1, 2]]}]})
    assert md.decode().splitlines()[:3] == ["| x\\|y | z |", "|---|---|", "| 1 | 2 |"]


@pytest.mark.parametrize(
    ("path", "spec", "reason"),
    [
        ("a.xlsx", {"sheets": [{"rows": [[{"x": 1}]]}]}, "spec.sheets[0].rows[0][0]"),
        # jsonschema's words for minItems: "should be non-empty" (4.21 on), "is too short" (4.18)
        ("a.xlsx", {"sheets": []}, "spec.sheets: []"),
        ("a.xlsx", {"sheets": [{"name": "a/b", "rows": []}]}, "spec.sheets[0].name"),
        ("a.docx", {"blocks": [{"type": "video"}]}, "'type' must be one of heading"),
        ("a.docx", {"blocks": [{"type": "heading", "text": "h", "level": 9}]}, "maximum of 4"),
        ("a.pdf", {"blocks": "text"}, "spec.blocks"),
        ("a.pptx", {"slides": [{"bullets": ["x"]}]}, "'title' is a required property"),
        ("a.exe", {"rows": []}, "cannot tell the format"),
    ],
)
def test_bad_specs_are_refused_with_a_located_reason(path: str, spec: object, reason: str) -> None:
    with pytest.raises(SpecError, match=None) as info:
        render(path, spec)
    assert reason in str(info.value)


def test_totals_are_capped() -> None:
    rows = [[1] * 500 for _ in range(500)]  # 250,000 cells, each list within the schema's bounds
    with pytest.raises(SpecError, match="over the limit of 200000"):
        render("big.xlsx", {"sheets": [{"rows": rows}]})


def test_totals_are_checked_before_the_schema() -> None:
    """The schema's validator takes seconds on a spec this big; the totals say no at once."""
    rows = [[1] * 500 for _ in range(500)]
    with pytest.raises(SpecError, match="over the limit of 200000"):
        render("big.xlsx", {"sheets": [{"name": "a/b", "rows": rows}]})  # a bad name too


def test_format_from_field_or_suffix() -> None:
    assert format_of("notes.markdown") == "md"
    assert format_of("report", "pdf") == "pdf"
    with pytest.raises(SpecError):
        format_of("x.txt", "exe")


def test_schema_is_versioned_and_describes_every_format() -> None:
    published = schema()
    assert published["$id"] == "jsonlbatch-render/1"
    assert set(published["$defs"]) >= {"xlsx", "docx", "pdf", "pptx", "csv", "md"}


def test_post_files_render_end_to_end(tmp_path: Path) -> None:
    """The CLI as a user runs it: good files written, bad spec refused in the manifest, no
    half-written file, unsafe path refused, other entries untouched."""
    text = answer(
        {"path": "out/budget.xlsx", "spec": SHEET},
        {"path": "memo.docx", "spec": DOC},
        {"path": "deck.pptx", "spec": DECK},
        {"path": "memo.pdf", "spec": DOC},
        {"path": "broken.docx", "spec": {"blocks": [{"type": "heading"}]}},
        {"path": "../escape.xlsx", "spec": SHEET},
        {"path": "plain.txt", "content": "just text"},
    )
    responses = tmp_path / "responses.jsonl"
    write_jsonl(responses, [chat_line("task-1", text)])
    out = tmp_path / "out"
    result = post("files", str(responses), "--out-dir", str(out), "--render")
    assert result.returncode == 0, result.stderr
    manifest = {r["path"]: r for r in read_jsonl(out / "manifest.jsonl")}
    assert manifest["out/budget.xlsx"]["status"] == "written"
    assert manifest["out/budget.xlsx"]["source"] == "render:xlsx"
    assert manifest["memo.pdf"]["source"] == "render:pdf"
    assert manifest["broken.docx"]["status"] == "refused"
    assert "'text' is a required property" in manifest["broken.docx"]["reason"]
    assert manifest["../escape.xlsx"]["status"] == "refused"
    assert manifest["plain.txt"]["status"] == "written"
    folder = out / "task-1"
    assert openpyxl.load_workbook(folder / "out/budget.xlsx")["Budget"]["B2"].value == 1200
    assert docx.Document(folder / "memo.docx").tables[0].rows[1].cells[0].text == "North"
    assert not (folder / "broken.docx").exists()
    assert not (tmp_path / "escape.xlsx").exists()
    assert "file refused" in result.stderr


def test_without_render_a_spec_is_refused_not_guessed(tmp_path: Path) -> None:
    responses = tmp_path / "responses.jsonl"
    write_jsonl(responses, [chat_line("t", answer({"path": "a.xlsx", "spec": SHEET}))])
    summary = extract_files(str(responses), str(tmp_path / "out"))
    records = read_jsonl(tmp_path / "out" / "manifest.jsonl")
    assert records[0]["status"] == "refused" and "--render" in records[0]["reason"]
    assert summary.written == 0


def test_missing_extra_is_named_up_front(tmp_path: Path) -> None:
    """Without the office libraries, --render stops before writing anything and names the
    extra (simulated by hiding openpyxl from the import system in a child process)."""
    responses = tmp_path / "responses.jsonl"
    write_jsonl(responses, [chat_line("t", answer({"path": "a.xlsx", "spec": SHEET}))])
    code = (
        "import sys\n"
        "sys.modules['openpyxl'] = None  # its import raises ImportError\n"
        "from jsonlbatch.cli import main\n"
        f"sys.argv = ['jsonlbatch', 'post', 'files', {str(responses)!r}, '--out-dir', "
        f"{str(tmp_path / 'out')!r}, '--render']\n"
        "main()\n"
    )
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert "jsonlbatch[render]" in result.stderr and "openpyxl" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_docs_publish_the_schema_the_code_validates_with() -> None:
    docs = (Path(__file__).parent.parent / "docs" / "post.md").read_text(encoding="utf-8")
    block = docs.split("<!-- render-schema:begin -->")[1].split("<!-- render-schema:end -->")[0]
    published = json.loads(block.strip().removeprefix("```json").removesuffix("```"))
    assert published == schema()
