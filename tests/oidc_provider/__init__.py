"""The tests' OpenID Connect provider: a real one, Django with django-oauth-toolkit (requirements-dev.txt), never used
by the app.

    python -m tests.oidc_provider serve --data DIR --port PORT --issuer http://localhost:PORT/o \\
        --client-id ID --client-secret SECRET --redirect-uri URI [--redirect-uri URI ...] [--id-token-s 300]
    python -m tests.oidc_provider users --data DIR set alice --password P --email a@x --groups chat-editors,chat-users
    python -m tests.oidc_provider users --data DIR set-groups alice chat-users
    python -m tests.oidc_provider users --data DIR list | delete alice
    python -m tests.oidc_provider client --data DIR set-redirect-uris URI [URI ...]

`serve` keeps everything in DIR (created if missing): the SQLite database (migrated at every start), the RSA key that
signs the ID tokens (RS256, made at the first start) and Django's secret key. It registers one confidential client
(authorization-code grant, PKCE with S256 required, consent skipped) and serves with waitress on 127.0.0.1. The admin
commands work on the same database while the server runs. tests/oidc_server.py starts it for the tests."""
