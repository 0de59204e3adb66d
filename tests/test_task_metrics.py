"""BLEU and ROUGE against values counted by hand (the n-gram matches written out below), with the official options."""

import math

import pytest

from untied_sc_lab.evaluation import corpus_bleu, rouge


def test_bleu_of_a_hand_counted_pair():
    # "the cat sat on mat" against "the cat sat on the mat": clipped n-gram matches 5/5, 3/4, 2/3, 1/2; the brevity
    # penalty exp(1 − 6/5).
    precisions = (5 / 5, 3 / 4, 2 / 3, 1 / 2)
    expected = 100 * math.exp(1 - 6 / 5) * math.exp(sum(map(math.log, precisions)) / 4)
    assert corpus_bleu(["the cat sat on mat"], ["the cat sat on the mat"]) == pytest.approx(expected, abs=1e-9)


def test_bleu_uses_the_effective_order_and_lowercases_as_the_official_code():
    # A 2-word hypothesis has no 3- or 4-grams: the effective order averages orders 1 and 2 only (both 1/1 here),
    # times the brevity penalty exp(1 − 3/2). Case is ignored (lowercase=True).
    assert corpus_bleu(["The Cat"], ["the cat sat"]) == pytest.approx(100 * math.exp(1 - 3 / 2), abs=1e-9)
    assert corpus_bleu(["Das Haus ist klein ."], ["das haus ist klein ."]) == pytest.approx(100.0)


def test_bleu_is_a_corpus_score_not_a_mean_of_sentence_scores():
    # The counts add over the corpus: unigrams 2 + 1 matches of 3 + 1, bigrams 1 of 2, trigrams 0 of 1 (no 4-gram:
    # the effective order is 3); sacreBLEU's default "exp" smoothing counts the first zero as 1/(2·total) = 1/2.
    # Hypotheses and references have 4 words each: no brevity penalty.
    score = corpus_bleu(["a b c", "d"], ["a b x", "d"])
    expected = 100 * math.exp((math.log(3 / 4) + math.log(1 / 2) + math.log(1 / 2)) / 3)
    assert score == pytest.approx(expected, abs=1e-9)


def test_rouge_of_a_hand_counted_pair():
    # Unigrams in common (clipped): the, cat, on, mat = 4 of 6 each side; bigrams: "the cat" = 1 of 5; the longest
    # common subsequence "the cat on mat" = 4 of 6.
    scores = rouge(["the cat lay on a mat"], ["the cat sat on the mat"])
    assert scores.mean["rouge1"] == pytest.approx(100 * 4 / 6)
    assert scores.mean["rouge2"] == pytest.approx(100 * 1 / 5)
    assert scores.mean["rougeL"] == pytest.approx(100 * 4 / 6)
    assert scores.count == 1 and scores.std["rouge1"] == 0.0 and scores.sem["rouge1"] == 0.0


def test_rouge_stems_as_the_official_scorer_and_averages_pairs():
    # Porter stems: cats → cat, running / runs → run: the first pair matches whole; the second shares nothing.
    scores = rouge(["cats running", "dog"], ["cat runs", "bird"])
    assert scores.mean["rouge1"] == pytest.approx(50.0)
    assert scores.std["rouge1"] == pytest.approx(50.0)  # population standard deviation of (100, 0)
    assert scores.sem["rouge1"] == pytest.approx(50.0 / math.sqrt(2))


@pytest.mark.parametrize("metric", [corpus_bleu, rouge])
def test_pairs_that_do_not_line_up_are_refused(metric):
    with pytest.raises(ValueError, match="one reference per generated text"):
        metric(["a", "b"], ["a"])
    with pytest.raises(TypeError, match="list of strings"):
        metric("a b", "a b")
    with pytest.raises(ValueError, match="at least one"):
        metric([], [])
