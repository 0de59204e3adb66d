"""Pairwise LLM-judge evaluation (the paper's adapted Arena-Hard-Auto v2 protocol, App. "Pairwise LLM-judge
evaluation protocol"): matched baseline/candidate pairs, blinded presentations in both orders, a judge model behind an
OpenAI-compatible endpoint, and the Arena score, pair outcomes and win rate with paired bootstrap intervals.

One job per module: [`pairs`] matches samples, [`export`] blinds them into a prompts file and a key, [`prompt`] renders
the judge prompt, [`client`] talks to the endpoint, [`cache`] keeps the replies, [`run`] drives a judging run,
[`verdicts`] parses and reads verdicts, [`score`] computes the statistics, [`report`] writes them, [`cli`] is
`untied-sc judge`. docs/judge.md describes the protocol and the file formats.
"""

from .cache import ReplyCache, request_key
from .client import ChatClient, ChatReply, JudgeRequestError
from .export import blind_presentations, export_presentations, read_key, read_prompts
from .pairs import SamplePair, match_pairs
from .prompt import DEFAULT_PROMPT_FILE, PromptTemplate, load_template, parse_template
from .report import format_markdown, write_report
from .run import run_judge
from .score import candidate_strength, score_verdicts
from .verdicts import VERDICTS, VerdictRecord, normalise_verdict, parse_verdict, read_verdicts
