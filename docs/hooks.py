"""mkdocs hooks: cross-reference roles as plain code, and default values instead of constant names.

The docstrings are numpy style and cross-reference with Sphinx roles
(``:class:`~shardvi.Samples```), which Markdown renders as the literal role name
before the code span. This hook drops the role name and, like Sphinx, shortens a
``~``-prefixed dotted path to its last component.

mkdocstrings renders a default value as the source text of the signature, so a
default held in a module constant (``linear_sampling=DEFAULT_LINEAR_SAMPLING``)
shows the constant's name. The second hook replaces such a name, in signatures and
in the ``default:`` of the parameter lists, by the constant's own expression in
the source (``CGConfig(tol=1e-6, maxiter=500)``) when it is short and the name has
one definition in the package.
"""

import ast
import html
import os
import re

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):(?=<code>)")
_TILDE = re.compile(r"<code>~(?:[\w]+\.)*([\w]+(?:\(\))?)</code>")
_CONSTANT = re.compile(r"^_?[A-Z][A-Z0-9_]*$")
_PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shardvi")
_MAX_LENGTH = 60  # a longer expression is less readable than its name


def _constants(package=_PACKAGE) -> dict:
    """``{NAME: expression source}`` of the package's module-level constants with one short definition."""
    found: dict = {}
    for folder, _, files in os.walk(package):
        for name in files:
            if not name.endswith(".py"):
                continue
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                source = f.read()
            for node in ast.parse(source).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target, value = node.targets[0], node.value
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    target, value = node.target, node.value
                else:
                    continue
                if isinstance(target, ast.Name) and _CONSTANT.match(target.id):
                    found.setdefault(target.id, set()).add(ast.get_source_segment(source, value))
    return {k: next(iter(v)) for k, v in found.items() if len(v) == 1 and len(next(iter(v)) or "") <= _MAX_LENGTH}


_VALUES = _constants()
# in a highlighted signature: ``=</span><span class="n">NAME</span>``
_SIGNATURE = re.compile(r'(<span class="o">=</span>)<span class="n">(_?[A-Z][A-Z0-9_]*)</span>')
# in a parameter list: ``default: <code><span title="module.NAME">NAME</span></code>``
_LISTED = re.compile(r'(default:\s*<code>)<span title="[\w.]*?(_?[A-Z][A-Z0-9_]*)">\2</span>(</code>)')


def _signature_value(m):
    value = _VALUES.get(m.group(2))
    return m.group(0) if value is None else f'{m.group(1)}<span class="n">{html.escape(value)}</span>'


def _listed_value(m):
    value = _VALUES.get(m.group(2))
    return m.group(0) if value is None else f"{m.group(1)}{html.escape(value)}{m.group(3)}"


def on_page_content(html_text, **kwargs):
    """Strip role prefixes and ``~`` paths from the rendered page."""
    return _TILDE.sub(r"<code>\1</code>", _ROLE.sub("", html_text))


def on_post_page(output, **kwargs):
    """Show constants' values as defaults (after autorefs has turned the names into spans)."""
    return _LISTED.sub(_listed_value, _SIGNATURE.sub(_signature_value, output))
