"""A griffe extension for the docs site: a function under `takes_options` shows the
package's options in its signature in place of `**options`, as `inspect.signature` shows
them at run time. The options are read from `OPTIONS` in tf_largeconv/_options.py by
static analysis, as the site reads everything else (importing the package would load
TensorFlow)."""

import ast
import pathlib

import griffe

_OPTIONS_PY = pathlib.Path(__file__).resolve().parent.parent / "tf_largeconv" / "_options.py"


def _options():
  """(name, default source, annotation) of each row of OPTIONS."""
  tree = ast.parse(_OPTIONS_PY.read_text(encoding="utf-8"))
  for node in tree.body:
    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "OPTIONS":
      for row in node.value.elts:
        name, default, _, _, annotation = row.args[:5]
        yield ast.literal_eval(name), ast.unparse(default), ast.literal_eval(annotation)


class OptionsSignature(griffe.Extension):
  """Replaces a `takes_options` function's `**options` by the options, keyword-only."""

  def on_function_instance(self, *, node, func, agent, **kwargs):
    if not any("takes_options" in str(d.value) for d in func.decorators):
      return
    params = [p for p in func.parameters if p.name != "options"]
    for name, default, annotation in _options():
      params.append(
        griffe.Parameter(
          name, annotation=annotation, kind=griffe.ParameterKind.keyword_only, default=default
        )
      )
    func.parameters = griffe.Parameters(*params)
