"""Text from elsewhere (a user's name, a child process's line) made safe to print on the
operator's terminal: each character that is neither printable nor a line break shown as
its escape (``\\x1b``), so that no control sequence reaches the terminal (pure)."""


def visible(text: str) -> str:
    return "".join(_visible(char) for char in text)


def _visible(char: str) -> str:
    return char if char.isprintable() or char == "\n" else char.encode("unicode_escape").decode()
