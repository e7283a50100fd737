"""A wrong token secret is refused with the client's own AuthError, saying why."""

import modal
import modal.exception

from checks import check, done, raises

e = raises("a wrong token secret: AuthError", modal.exception.AuthError, lambda: modal.App.lookup("x", create_if_missing=True))
check("...saying the secret is not an API key", "not an API key" in str(e), str(e))
done("auth")
