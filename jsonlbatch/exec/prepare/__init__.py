"""Before sending: whole-file passes over the input and the output.

`input_scan` reads the request file once (valid? pending? early answers), `resume_scan`
what the output already holds; `wrong_file_hints` says what a file that is not a request
file is. `dry_run`, `validate` and `shard` are the commands that stop here.
"""
