"""Sending one request: its attempts until it has a result.

`sender` (the `Sender`) meters the request (`budget`, `rate_limits`,
`rate_limit_headers`) and tries again (`retry`) until it has a result; `transport` posts
one attempt (`priority`), reads the answer within its caps (`body_caps`, `streaming`,
`stream_choices`) and says what it means (`http_reply`).
"""
