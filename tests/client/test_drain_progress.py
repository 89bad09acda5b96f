"""The drain progress bar: copies made out of those planned."""

from kvpool_client.admin.drain import _progress_bar


def test_bar_fills_in_proportion_and_never_overflows() -> None:
    assert _progress_bar(0, 0) == "[" + "." * 30 + "] 0/0 copies"
    assert _progress_bar(50, 200) == "[" + "#" * 7 + "." * 23 + "] 50/200 copies"
    assert _progress_bar(200, 200) == "[" + "#" * 30 + "] 200/200 copies"
    assert _progress_bar(250, 200).startswith("[" + "#" * 30 + "]"), "retried copies must not overflow the bar"
