"""The HTTP face of the server: app and routes, request bodies, validation, auth, errors, metrics, CLI and
config, and the runtime that holds one server process's parts. It hands drafting to drafter/scheduling/ and
asks drafter/sessions/ what a call means; it never touches a tensor."""
