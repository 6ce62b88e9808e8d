"""Files on disk: JSONL read and written crash-safely (`jsonl`), which output a command may
write (`output_guard`), and hand-written settings files checked key by key (`filecheck`).
"""
