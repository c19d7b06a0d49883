"""The web framework met in one room: Chainlit's page, its hooks' bodies, its patches, and the routes the app mounts."""
