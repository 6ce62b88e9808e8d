"""The input scan notes each pending line's look-ahead group, so the window neither reads nor
parses a line again to order it; the order must be the one it found by reading (issue 44)."""

from __future__ import annotations

import base64
import json
import os
from array import array

from jsonlbatch.exec.prepare.file_refs import FileRefs
from jsonlbatch.exec.prepare.input_scan import groups_of, scan_input
from jsonlbatch.exec.route import router
from jsonlbatch.exec.route.router import RouteOptions, ordered_lines, window_group


def _line(cid: str, content: object, model: str = "m") -> str:
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    return json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                       "body": body}) + "\n"  # fmt: skip


def _requests(tmp_path) -> str:
    """Questions about 8 pictures, 5 each, interleaved; text lines; lines naming a file."""
    refs = [tmp_path / "a.txt", tmp_path / "b.txt"]  # two paths, one content: one hash
    for ref in refs:
        ref.write_text("reference")
    pictures = [base64.b64encode(os.urandom(3000)).decode() for _ in range(8)]
    lines = []
    for n in range(40):
        url = f"data:image/png;base64,{pictures[n % 8]}"
        lines.append(_line(f"i{n}", [{"type": "image_url", "image_url": {"url": url}},
                                     {"type": "text", "text": f"question {n}"}]))  # fmt: skip
        if n % 5 == 0:
            lines.append(_line(f"t{n}", "short"))  # no group: too short a prompt
        if n % 10 == 0:  # the scan reads these with the file's hash in the path's place; the
            # window groups them by the line as written (the paths differ)
            part = {"type": "file", "file": {"file_id": f"file://{refs[n // 10 % 2]}"}}
            lines.append(_line(f"f{n}", [part, {"type": "text", "text": "x" * 3000}]))
    path = tmp_path / "req.jsonl"
    path.write_text("".join(lines))
    return str(path)


def test_the_scans_groups_order_the_lines_as_reading_them_does(tmp_path, monkeypatch):
    path = _requests(tmp_path)
    route = RouteOptions(order_window=64)
    scan = scan_input(path, refs=FileRefs(), group=window_group(route))
    pending = scan.pending
    assert len(scan.groups) == len(pending) == scan.total and scan.ref_lines == 4
    assert -1 in scan.groups  # the short lines have none
    by_reading = list(ordered_lines(path, pending, route))
    assert by_reading != list(ordered_lines(path, pending, RouteOptions(order_window=0)))
    reads = []
    real = router.read_lines_at

    def counted(p, offsets):
        offsets = list(offsets)
        reads.append(len(offsets))
        return real(p, offsets)

    monkeypatch.setattr(router, "read_lines_at", counted)
    by_scan = list(ordered_lines(path, pending, route, groups_of(scan, pending)))
    assert by_scan == by_reading
    assert reads == [len(pending)]  # each line read once, to send it
    some = array("Q", pending[1::3])  # a pool's lines, or those a store left
    assert list(ordered_lines(path, some, route, groups_of(scan, some))) == list(
        ordered_lines(path, some, route)
    )


def test_no_groups_for_lines_the_scan_did_not_leave_pending(tmp_path):
    path = _requests(tmp_path)
    route = RouteOptions(order_window=64)
    assert groups_of(scan_input(path), array("Q", [0])) is None  # not asked for groups
    scan = scan_input(path, refs=FileRefs(), group=window_group(route))
    assert groups_of(scan, array("Q", [scan.pending[0] + 1])) is None
    assert window_group(RouteOptions(order_window=1)) is None
    assert window_group(RouteOptions(policy="round-robin")) is None
    plain = scan_input(path, group=None)
    assert plain.ref_lines == 0 and not plain.groups  # refs not asked for: nothing searched
