"""The answer contract: JSON Schemas declared in requests (`schema_forms`: each endpoint's
form, read and written), answers checked against them (`contract`: validators and
verdicts), and the bounds that keep a hostile schema's check cheap (`schema_bounds`,
`bounded_check`).
"""
