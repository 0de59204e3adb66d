"""Pairwise LLM-judge evaluation (the paper's adapted Arena-Hard-Auto v2 protocol, App. "Pairwise LLM-judge
evaluation protocol"): matched baseline/candidate pairs, blinded presentations in both orders, a judge model behind an
OpenAI-compatible endpoint, and the Arena score, pair outcomes and win rate with paired bootstrap intervals.

One job per module: [`pairs`] matches samples, [`export`] blinds them into a prompts file and a key, [`prompt`] renders
the judge prompt, [`client`] talks to the endpoint, [`cache`] keeps the replies, [`run`] drives a judging run,
[`verdicts`] parses and reads verdicts, [`score`] computes the statistics, [`report`] writes them, [`cli`] is
`untied-sc judge`; [`records`] holds the files' typed records. docs/judge.md describes the protocol and the file formats.
"""

from untied_sc.lazy_imports import lazy_attributes


# Imported on first access: importing the package (e.g. for the command line's argument parser) loads nothing heavy.
__getattr__, __dir__, __all__ = lazy_attributes(
    __name__,
    {
        ".cache": ("ReplyCache", "request_key"),
        ".client": ("ChatClient", "ChatReply", "JudgeRequestError"),
        ".export": ("ExportPaths", "blind_presentations", "export_presentations", "read_key", "read_prompts"),
        ".pairs": ("SamplePair", "match_pairs"),
        ".prompt": ("DEFAULT_PROMPT_FILE", "PromptTemplate", "load_template", "parse_template"),
        ".records": (
            "CachedReply",
            "JudgeKey",
            "JudgeScore",
            "PairOrigin",
            "PairOutcome",
            "Presentation",
            "Prompt",
            "RunSummary",
        ),
        "..record_fields": ("RecordError",),
        ".report": ("ReportPaths", "format_markdown", "write_report"),
        ".run": ("run_judge",),
        ".score": ("candidate_strength", "score_verdicts"),
        ".verdicts": ("VERDICTS", "VerdictRecord", "normalise_verdict", "parse_verdict", "read_verdicts"),
    },
)
