"""Agent sessions: the calls that share an ``x-session-id``, tallied from their ledger
records, ended when idle, cancelled as a whole."""
