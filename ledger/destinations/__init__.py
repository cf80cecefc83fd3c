"""Destinations: an integration's accepted events forwarded to an HTTP endpoint (CONTRACT 8).

`store` keeps destinations, their signing secrets and the answers to each attempt;
`guard` keeps requests away from internal addresses; `forward` makes the signed POST
and maps the answer to an outcome (`outcomes`).
"""
