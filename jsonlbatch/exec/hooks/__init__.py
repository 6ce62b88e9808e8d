"""What a caller plugs into a run (`seams.Seams`), and exec's own answer contract.

`check_hook`: the on-answer check; `store_hook`: the answer store asked before sending and
fed after, and `answer_cache`, the answer cache (`exec --cache`) as one; `contract_check`:
the schema check (and re-asks) that runs as a check hook.
"""
