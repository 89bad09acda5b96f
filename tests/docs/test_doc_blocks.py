"""The Markdown block reader behind the docs test: which blocks run, which say why not, what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.doc_blocks import blocks, problems

PAGE = """# A page

```bash
kvpoolctl status
```
```text
NODE  STATE
```

<!-- not-run: needs a Kubernetes cluster -->
```bash
kubectl get pods
```

- in a list:

  ```python
  print("indented")
  ```

```yaml
a: 1
```
"""


def page(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(text)
    return path


def test_blocks_in_order_with_their_marker_and_output(tmp_path: Path) -> None:
    found = blocks(page(tmp_path, PAGE))
    assert [(b.line, b.lang) for b in found] == [(3, "bash"), (6, "text"), (11, "bash"), (17, "python"), (21, "yaml")]
    status, output, kubectl, indented, config = found
    assert status.to_run and status.output == "NODE  STATE\n" and status.code == "kvpoolctl status\n"
    assert kubectl.not_run == "needs a Kubernetes cluster" and not kubectl.to_run and kubectl.output is None
    assert indented.to_run and indented.code == 'print("indented")\n', "dedented to the fence"
    assert not output.runnable and not config.runnable
    assert problems(page(tmp_path, PAGE)) == []


def test_an_output_block_belongs_to_the_block_right_above_it(tmp_path: Path) -> None:
    text = "```bash\necho hi\n```\n\nthen some prose\n\n```text\nhi\n```\n"
    (command, _) = blocks(page(tmp_path, text))
    assert command.output is None, "prose between the two: the text block is not this command's output"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("```\nkvpoolctl status\n```\n", "page.md:1: name the block's language"),
        ("<!-- not-run: -->\n```bash\nx\n```\n", "page.md:2: a not-run marker needs a reason"),
        ("<!-- not-run: why -->\n\n```bash\nx\n```\n", "page.md:1: a not-run marker must be the line right before"),
        ("<!-- not-run: output -->\n```text\nx\n```\n", "page.md:2: a not-run marker on a text block"),
    ],
)
def test_problems_name_the_line_and_what_to_do(tmp_path: Path, text: str, problem: str) -> None:
    found = problems(page(tmp_path, text))
    assert any(p.startswith(problem) for p in found), found


def test_a_fence_never_closed_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"page\.md:1: a fence that is never closed"):
        blocks(page(tmp_path, "```bash\necho\n"))
