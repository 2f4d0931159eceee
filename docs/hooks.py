"""mkdocs hook: render the reST cross-reference roles of the docstrings as plain code.

The docstrings are numpy style and cross-reference with Sphinx roles
(``:class:`~shardvi.Samples```), which Markdown renders as the literal role name
before the code span. This hook drops the role name and, like Sphinx, shortens a
``~``-prefixed dotted path to its last component.
"""

import re

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):(?=<code>)")
_TILDE = re.compile(r"<code>~(?:[\w]+\.)*([\w]+(?:\(\))?)</code>")


def on_page_content(html, **kwargs):
    """Strip role prefixes and ``~`` paths from the rendered page."""
    return _TILDE.sub(r"<code>\1</code>", _ROLE.sub("", html))
