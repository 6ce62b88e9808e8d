"""The OpenAI Batch format every stage reads and writes: request and response lines
(`records`), what a usable answer is per endpoint (`answers`), what a response line says
choice by choice (`samples`), a compact set of custom_ids (`idset`), and pictures and
files inside requests (`media`).
"""
