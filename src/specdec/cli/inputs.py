"""What ``specdec generate`` is asked, read and checked before anything is loaded: the prompt
(an argument, ``-p`` or standard input), earlier chat turns (``--messages``), the expected
output (``--prediction``) and the decoding options, as one checked ``GenerationRequest``
(``specdec.request``: the request the pair generates, built here once). Files
and standard input are read with a size bound (``specdec.util.textfiles``): an endless pipe or a
device is an error, not a hang."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from specdec.errors import ConfigError
from specdec.prompting import check_text, read_messages
from specdec.util.textfiles import read_text

if TYPE_CHECKING:
    from specdec.constraints.spec import Constraint
    from specdec.request import GenerationRequest

MAX_TEXT_FILE = 16 << 20  # bytes of a prompt or prediction read at most
MAX_GRAMMAR_FILE = 1 << 20  # bytes of a JSON schema or a grammar read at most


def read_inputs(args: argparse.Namespace) -> GenerationRequest:
    """The prompt, messages, prediction and decoding options of the command line as one
    request (the prompt as text: the pair encodes it once loaded), or one ConfigError."""
    from specdec.request import make_request  # torch: not for --help

    if args.prompt is not None and args.prompt_option is not None:
        raise ConfigError("give the prompt once: as the argument or with -p/--prompt")
    given = args.prompt if args.prompt is not None else args.prompt_option
    if [given, args.messages, args.prediction].count("-") > 1:
        raise ConfigError("standard input ('-') can be read once: give the others as files")
    if given is None and args.messages is None:
        raise ConfigError("give a prompt (argument or -p/--prompt) or --messages FILE")
    prompt = None
    if given == "-":
        prompt = read_text("-", "the prompt", MAX_TEXT_FILE)
    elif given is not None:  # argv bytes that were not UTF-8 arrive as lone surrogates
        check_text(given, "the prompt")
        prompt = given
    if prompt is not None and not prompt.strip():
        raise ConfigError("the prompt is empty")
    messages = read_messages(args.messages) if args.messages is not None else None
    prediction = None
    if args.prediction is not None:
        prediction = read_text(args.prediction, "--prediction", MAX_TEXT_FILE)
    constraint = read_constraint(args)
    return make_request(
        prompt,
        messages=messages,
        system=args.system,
        raw=args.raw,
        chat=True if args.chat else None,  # None: the template if the target has one
        max_new_tokens=args.max_new_tokens,
        k=args.k,
        adaptive=args.adaptive,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop_on_eos=not args.no_stop,
        stop=args.stop,
        prediction=prediction,
        parse_special=args.parse_special,  # the prompt's, the messages' and the prediction's
        constraint=constraint,
    )


def read_constraint(args: argparse.Namespace) -> Constraint | None:
    """``--json-schema FILE`` or ``--grammar FILE`` as a constraint naming its flag (checked
    against the model's vocabulary once it is loaded), or None."""
    from specdec.constraints.spec import grammar_constraint, json_schema

    if getattr(args, "json_schema", None) is not None:
        text = read_text(args.json_schema, "--json-schema", MAX_GRAMMAR_FILE)
        return json_schema(text, "--json-schema")
    if getattr(args, "grammar", None) is not None:
        text = read_text(args.grammar, "--grammar", MAX_GRAMMAR_FILE)
        return grammar_constraint(text, "--grammar")
    return None
