"""What a request and an answer cost: token estimates before sending (`cost`) and the
price table and billed usage after (`prices`).
"""
