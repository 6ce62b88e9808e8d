"""One renderer per format: a validated spec in, the file's bytes out (nothing touches disk).

Each renderer reads only what the schema allows, so the code stays a straight walk over the spec.
The libraries are imported inside the renderers: the module loads without the `render` extra.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import os
from collections.abc import Callable, Iterable
from typing import Any

Cell = str | int | float | bool | None

_FONT_DIRS = ("/usr/share/fonts/truetype/dejavu", "/usr/share/fonts/dejavu")


def _table(spec: dict[str, Any]) -> tuple[list[list[Cell]], bool]:
    rows = [list(row) for row in spec.get("rows", [])]
    width = max((len(row) for row in rows), default=0)
    return [row + [None] * (width - len(row)) for row in rows], spec.get("header", True)


def _text(cell: Cell) -> str:
    if cell is None:
        return ""
    if isinstance(cell, bool):
        return "TRUE" if cell else "FALSE"
    if isinstance(cell, float) and cell.is_integer():
        return str(int(cell))
    return str(cell)


def render_xlsx(spec: dict[str, Any]) -> bytes:
    from openpyxl import Workbook
    from openpyxl.styles import Font
    from openpyxl.utils import get_column_letter

    book = Workbook()
    book.remove(book.active)
    used: set[str] = set()
    for n, sheet_spec in enumerate(spec["sheets"], 1):
        name = sheet_spec.get("name") or f"Sheet{n}"
        if name.lower() in used:
            name = f"{name[:27]}-{n}"
        used.add(name.lower())
        sheet = book.create_sheet(name)
        for row in sheet_spec["rows"]:
            sheet.append(list(row))  # numbers stay numbers; "=..." strings are formulas
        for col, width in enumerate(sheet_spec.get("column_widths", []), 1):
            if width is not None:
                sheet.column_dimensions[get_column_letter(col)].width = width
        if sheet_spec["rows"]:
            for cell in sheet[1]:
                cell.font = Font(bold=True)
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def render_docx(spec: dict[str, Any]) -> bytes:
    from docx import Document

    doc = Document()
    if spec.get("title"):
        doc.add_heading(spec["title"], level=0)
    for block in spec["blocks"]:
        kind = block["type"]
        if kind == "heading":
            doc.add_heading(block["text"], level=block.get("level", 1))
        elif kind == "paragraph":
            doc.add_paragraph(block["text"])
        elif kind == "bullets":
            style = "List Number" if block.get("ordered") else "List Bullet"
            for item in block["items"]:
                doc.add_paragraph(item, style=style)
        else:
            rows, header = _table(block)
            if not rows:
                continue
            table = doc.add_table(rows=len(rows), cols=len(rows[0]))
            table.style = "Table Grid"
            for r, row in enumerate(rows):
                for c, value in enumerate(row):
                    cell = table.cell(r, c)
                    cell.text = _text(value)
                    if header and r == 0:
                        for run in cell.paragraphs[0].runs:
                            run.bold = True
    out = io.BytesIO()
    doc.save(out)
    return out.getvalue()


def render_pptx(spec: dict[str, Any]) -> bytes:
    from pptx import Presentation
    from pptx.util import Inches, Pt

    deck = Presentation()
    title_and_body, title_only = deck.slide_layouts[1], deck.slide_layouts[5]
    for slide_spec in spec["slides"]:
        table_spec = slide_spec.get("table")
        bullets = slide_spec.get("bullets", [])
        slide = deck.slides.add_slide(title_only if table_spec else title_and_body)
        slide.shapes.title.text = slide_spec["title"]
        top: int = Inches(1.6)
        if table_spec is None:
            body = slide.placeholders[1].text_frame
            for n, item in enumerate(bullets):
                paragraph = body.paragraphs[0] if n == 0 else body.add_paragraph()
                paragraph.text = item
        else:
            if bullets:
                box = slide.shapes.add_textbox(
                    Inches(0.5), top, Inches(9), Inches(0.4 * len(bullets))
                )
                for n, item in enumerate(bullets):
                    paragraph = (
                        box.text_frame.paragraphs[0] if n == 0 else box.text_frame.add_paragraph()
                    )
                    paragraph.text = "\u2022 " + item
                top += Inches(0.4 * len(bullets) + 0.2)
            rows, header = _table(table_spec)
            if rows:
                shape = slide.shapes.add_table(
                    len(rows), len(rows[0]), Inches(0.5), top, Inches(9), Inches(0.35 * len(rows))
                )
                shape.table.first_row = header
                for r, row in enumerate(rows):
                    for c, value in enumerate(row):
                        cell = shape.table.cell(r, c)
                        cell.text = _text(value)
                        cell.text_frame.paragraphs[0].font.size = Pt(12)
        if slide_spec.get("notes"):
            slide.notes_slide.notes_text_frame.text = slide_spec["notes"]
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def _unicode_font() -> tuple[str, str] | None:
    """(regular, bold) DejaVu Sans files: the system's, else the copy matplotlib ships."""
    dirs = list(_FONT_DIRS)
    found = importlib.util.find_spec("matplotlib")
    for location in (found.submodule_search_locations or []) if found else []:
        dirs.append(os.path.join(location, "mpl-data", "fonts", "ttf"))
    for folder in dirs:
        regular = os.path.join(folder, "DejaVuSans.ttf")
        bold = os.path.join(folder, "DejaVuSans-Bold.ttf")
        if os.path.isfile(regular) and os.path.isfile(bold):
            return regular, bold
    return None


def _as_is(text: str) -> str:
    return text


def _latin1(text: str) -> str:
    return text.encode("latin-1", "replace").decode("latin-1")


def render_pdf(spec: dict[str, Any]) -> bytes:
    from fpdf import FPDF
    from fpdf.fonts import FontFace

    pdf = FPDF(format="A4")
    pdf.set_auto_page_break(True, margin=15)
    font = _unicode_font()
    if font:
        pdf.add_font("body", "", font[0])
        pdf.add_font("body", "B", font[1])
        family, clean = "body", _as_is
    else:  # core fonts know Latin-1 only: other characters become "?" rather than failing
        family, clean = "helvetica", _latin1

    pdf.add_page()
    width = pdf.epw
    sizes = {0: 20, 1: 16, 2: 14, 3: 12, 4: 11}

    def write(text: str, size: int = 11, style: str = "", indent: str = "") -> None:
        pdf.set_font(family, style, size)
        pdf.multi_cell(width, size * 0.55, clean(indent + text), new_x="LMARGIN", new_y="NEXT")

    if spec.get("title"):
        write(spec["title"], sizes[0], "B")
        pdf.ln(2)
    for block in spec["blocks"]:
        kind = block["type"]
        if kind == "heading":
            pdf.ln(2)
            write(block["text"], sizes[block.get("level", 1)], "B")
        elif kind == "paragraph":
            write(block["text"])
        elif kind == "bullets":
            for n, item in enumerate(block["items"], 1):
                write(
                    item, indent=f"{n}. " if block.get("ordered") else "\u2022 " if font else "- "
                )
        else:
            rows, header = _table(block)
            if not rows:
                continue
            pdf.set_font(family, "", 10)
            with pdf.table(
                first_row_as_headings=header, headings_style=FontFace(emphasis="BOLD")
            ) as table:
                for row in rows:
                    table.row([clean(_text(v)) for v in row])
        pdf.ln(1)
    return bytes(pdf.output())


def render_csv(spec: dict[str, Any]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for row in spec["rows"]:
        writer.writerow(["" if v is None else _text(v) if isinstance(v, bool) else v for v in row])
    return out.getvalue().encode("utf-8")


def _md_cell(value: Cell) -> str:
    return _text(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")


def _md_table(rows: list[list[Cell]], header: bool) -> Iterable[str]:
    if not rows:
        return
    head = rows[0] if header else [""] * len(rows[0])
    yield "| " + " | ".join(_md_cell(v) for v in head) + " |"
    yield "|" + "---|" * len(head)
    for row in rows[1:] if header else rows:
        yield "| " + " | ".join(_md_cell(v) for v in row) + " |"


def render_md(spec: dict[str, Any]) -> bytes:
    lines: list[str] = []
    if spec.get("title"):
        lines += [f"# {spec['title']}", ""]
    for block in spec["blocks"]:
        kind = block["type"]
        if kind == "heading":
            lines.append(
                "#" * (block.get("level", 1) + (1 if spec.get("title") else 0))
                + " "
                + block["text"]
            )
        elif kind == "paragraph":
            lines.append(block["text"])
        elif kind == "bullets":
            ordered = block.get("ordered")
            lines += [
                f"{n}. {item}" if ordered else f"- {item}"
                for n, item in enumerate(block["items"], 1)
            ]
        else:
            lines += _md_table(*_table(block))
        lines.append("")
    return "\n".join(lines).encode("utf-8")


RENDERERS: dict[str, Callable[[dict[str, Any]], bytes]] = {
    "xlsx": render_xlsx,
    "docx": render_docx,
    "pdf": render_pdf,
    "pptx": render_pptx,
    "csv": render_csv,
    "md": render_md,
}
