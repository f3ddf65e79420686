"""ACP 2, test only: a second major version served beside ACP 1 (docs/versions.md, "Majors").

Its proto (``proto/cleveragents/acp/v2/session.proto``) lives here, outside ``proto/``, so
it ships in no package and in no released buf image; its Python code is generated at test
time into a temporary folder (``contract.generate``), so there is no second generated tree
to keep in step.
"""
