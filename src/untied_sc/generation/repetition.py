"""Word repetition of a decoded text: the label ACE's direction is estimated on and the Rep-n the lab reports."""


def word_ngrams(text: str, n: int) -> list[tuple[str, ...]]:
    """The word n-grams of `text`, words being its whitespace-separated pieces (case and punctuation kept)."""
    if n < 1:
        raise ValueError(f"`n` must be at least 1, got {n}.")
    words = text.split()
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]


def word_repetition(text: str, n: int = 4) -> float:
    """Rep-n of one text: the fraction of its word n-grams that repeat an earlier one, 1 - #unique / #total.

    0 for a text with fewer than `n` words. E.g. "a b c d a b c d" has 5 4-grams, 4 unique → Rep-4 = 0.2.
    """
    ngrams = word_ngrams(text, n)
    return 1.0 - len(set(ngrams)) / len(ngrams) if ngrams else 0.0
