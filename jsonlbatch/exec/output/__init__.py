"""The written line and what the user sees.

`recorder` appends one whole line per result, `events` tells listeners what happened,
`progress_bar` is one of them, `run_summary` is what the run did and `run_outcome` what a
Python caller gets back (the summary, the answers by custom_id).
"""
