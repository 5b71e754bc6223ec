"""Comparative sentences computed, not written: the one home of the rule that a sentence comparing two rows of
results/README.md's tables cites a comparison those tables computed, and says what that comparison says.

A sentence cites a comparison by its id, ROW/REFERENCE as the tables name the row and its "vs" cell, in a marker
that `relnmt-table` fills from the page's tables (a number in prose is never written by hand):

    T5 at its rate is higher than T5 (<!-- cmp en-de.t5_lr10/en-de.t5 --><!-- /cmp -->)
    -> T5 at its rate is higher than T5 (<!-- cmp en-de.t5_lr10/en-de.t5 -->+3.64 BLEU, p = 0.002, adjusted
       0.047: higher<!-- /cmp -->)

(several ids, comma-separated, give their clauses joined by "; "). The marker is an HTML comment, so the rendered
page shows the clause alone. The words a sentence uses are checked against what it cites (`disagreements`): before
each marker, back to the previous marker or the sentence's start, a word that says "higher" (higher, above, ahead,
beats, best, ...) needs the verdict "higher", one that says "lower" (lower, below, behind, trails, worst, ...) the
verdict "lower", and one that says "no difference" (no difference, level with, closes, not found, a negated
"higher" or "lower") a null verdict; said of the means ("its mean is higher", "higher by the means") a direction
needs only the means' sign. A comparison of fewer than 3 seeds a row has no test: only its means' sign can be said.
A sentence that compares rows with none of these words and without a computed comparison (`uncited`) says so in
the words of DESCRIBED ("two seeds, no test"), or quotes one in the form "p = X, adjusted Y" (checked by
tests/test_significance.py against the tables).

A percentage of one row's mean of another's is a marker too, `<!-- pct ROW/REFERENCE -->77%<!-- /pct -->`
(`cite_percentages`); `unsupported_claims` finds the claims that a direction word does not cover.

A chance level on a synthetic task is the shortcut check's figure (experiments/shortcuts.py): a sentence that
states one (`chance_uncited`) cites it with `<!-- chance TASK LENGTH SHARE -->FIGURE<!-- /chance -->`, TASK
`offset` or `repeat` (experiments/extrapolate.py's tasks, whose copy task reach.py shares) or `marker`
(experiments/edge_values.py), SHARE a key of `shortcut_shares` ("best", "offset", "mode", ...; "best@3": with the
commonest symbol 3 or more places to the left) or of `marker_shortcuts`, FIGURE its population value (weighted as
the accuracy is), written by `python -m experiments.chance --cite FILE ...` (experiments depend on nmt, never back).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

GENERATED = re.compile(r"<!-- results:(\S+) -->.*?<!-- /results:\1 -->", re.DOTALL)
CITATION = re.compile(r"<!-- cmp (?P<ids>[^>]*?) -->(?P<clause>.*?)<!-- /cmp -->", re.DOTALL)
CHANCE = re.compile(r"<!-- chance (?P<task>\S+) (?P<length>\d+) (?P<share>\S+) -->(?P<figure>.*?)<!-- /chance -->")
CHANCE_LEVEL = re.compile(r"\bchance\b(?! of any)", re.IGNORECASE)  # "the chance of any false verdict" is no level
SHORTCUT, SHARE = re.compile(r"\bshortcuts?\b", re.IGNORECASE), re.compile(r"\b0\.\d+")
QUOTED = re.compile(r"p\s+=\s+(?:< 0\.001|[\d.]+\d),\s+adjusted\s+")  # the form tests/test_significance.py checks
PERCENT = re.compile(r"<!-- pct (?P<ids>[^>]*?) -->(?P<figure>.*?)<!-- /pct -->")  # ROW/REFERENCE: mean / mean

# The words that compare rows, by what they claim. A superlative claims the direction against every row it names.
OBJECT = (r"(?=\s+(?:[\d(+−]|every|each|all|any|its|their|the best|chance|what|both|relative|absolute|sinusoids|T5|"
          r"ALiBi|RoPE|learned|buckets|k = |`))")  # "above"/"below" compare only before what they compare with
HIGHER = rf"higher|highest|above{OBJECT}|ahead|beats?|better|best|leads?|exceeds?|outperforms?"
LOWER = rf"lower|lowest|below{OBJECT}|behind{OBJECT}|trails?|worse|worst|short of|less well|the floor"
NULL = r"no (?:\w+ )?difference|level with|closes|not found|not shown|indistinguishable|on par"
NEGATION = r"\b(?:not|no|nor|neither|never)\b(?:\W+\w+){0,3}?\W+$"  # a direction word read as "no difference" after it
MEANS = re.compile(r"\bmeans?\b")
# Words that mark a sentence as describing single runs or untested means, not concluding
DESCRIBED = re.compile(r"no test|not tested|tests? nothing|one seed|n < 3 seeds|(?:two|2) seeds, no")
# What a sentence names when it compares rows: the position modes and the ablations' rows, as the prose names them
ROWS = re.compile(r"\b(?:relative|absolute|sinusoids?|learned|`both`|`none`|T5|t5|ALiBi|alibi|RoPE|rope|buckets|"
                  r"k = \d+|a\^K|a\^V|per-head|shared tables|edge tables|neither)\b", re.IGNORECASE)
# Claims that need a test or a table beyond a direction word (unsupported_claims, percent_uncited):
PERCENT_OF_ROW = re.compile(rf"\d\s?%[^.;]{{0,40}}?\bof\s+(?:the\s+)?{ROWS.pattern}", re.I)  # "72% of sinusoids'"
NUMBERS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}
SUPERLATIVE = re.compile(rf"\b(?:best|worst|highest|lowest)\b(?:\s+\w+){{0,2}}\s+of\s+(?:the\s+|all\s+)?"
                         rf"(?P<n>{'|'.join(NUMBERS)})\b", re.I)
GAIN = re.compile(r"\bgains?\s+of\b", re.I)  # "the gain of X over Y": a direction that needs its test
UNIVERSAL = re.compile(r"\bcannot\b|\bonly\s+\S+\s+differs?\b|\bwhatever\s+k\b|\bevery\s+(?:distance|length|offset)"
                       r"\b(?!\s+(?:in|from|measured|tested|tried))", re.I)  # a law over what was not all measured
RECOMMENDS = re.compile(r"\b(?:deploys?|recommend(?:s|ed)?|use it|can be used|safe to|is enough|equivalent|"
                        r"interchangeable|costs? nothing|at no cost)\b", re.IGNORECASE)
HEDGED = re.compile(r"detectable|smaller differences|not ruled out|cost not measured", re.IGNORECASE)


@dataclass(frozen=True)
class Comparison:
    """One comparison of the page's tables: the row's mean minus its reference's (as printed), Welch's p over
    seeds, the Holm-adjusted p over the page's family, and the verdict, as their cells read."""
    difference: float
    raw: str
    adjusted: str
    verdict: str

    def clause(self) -> str:
        """What a citing sentence shows of it."""
        if self.verdict == "no test":
            return f"{self.difference:+.2f} BLEU, {self.raw}: no test"
        found = re.fullmatch(r"no difference found \(detectable: ([\d.]+)\)", self.verdict)
        word = f"no difference found, detectable {found.group(1)}" if found else self.verdict
        return f"{self.difference:+.2f} BLEU, {p_text('p', self.raw)}, {p_text('adjusted', self.adjusted)}: {word}"

    def direction(self) -> str:
        """"higher", "lower" or "null" (no difference found), what the verdict concludes; "untested" for none."""
        return {"higher": "higher", "lower": "lower", "no test": "untested"}.get(self.verdict, "null")


def p_text(name: str, cell: str) -> str:
    """"p = 0.058", "p < 0.001", "adjusted 0.467": a p as the prose quotes it."""
    return f"p = {cell}" if name == "p" and not cell.startswith("<") else f"{name} {cell}"


def table_cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def generated_tables(text: str) -> list[list[dict]]:
    """Each BLEU table that relnmt-table wrote (nmt/lab/page.py: the header with the Holm and verdict columns): its rows
    as {column: cell}."""
    tables, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("| row |") and "p (Holm, all tables)" in line:
            head, rows = table_cells(line), []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                rows.append(dict(zip(head, table_cells(row))))
            tables.append(rows)
    return tables


def comparisons(page: str) -> dict[str, Comparison]:
    """{"ROW/REFERENCE": its comparison} over every generated table of the page (a comparison printed in two
    tables, the same cells, is one; two that disagree are an error)."""
    found: dict[str, Comparison] = {}
    for rows in generated_tables(page):
        mean = {row["row"]: float(row["sacreBLEU (mean ± std)"].split()[0]) for row in rows}
        for row in (r for r in rows if r["vs"]):
            columns = (row[c].split(" / ") for c in ("vs", "p (seeds, Welch)", "p (Holm, all tables)",
                                                     "verdict (Holm, family-wise 0.05)"))
            for reference, raw, adjusted, verdict in zip(*columns):
                key = f"{row['row']}/{reference}"
                comparison = Comparison(round(mean[row["row"]] - mean[reference], 2), raw, adjusted, verdict)
                if found.setdefault(key, comparison) != comparison:
                    raise ValueError(f"{key}: two tables print it differently ({found[key]} and {comparison})")
    return found


def row_means(page: str) -> dict[str, float]:
    """{row: its mean sacreBLEU over seeds} over every generated table of the page."""
    return {row["row"]: float(row["sacreBLEU (mean ± std)"].split()[0])
            for rows in generated_tables(page) for row in rows}


def cite_percentages(text: str, means: dict[str, float]) -> str:
    """The text with every pct marker's figure written from the page's means: "ROW/REF" gives ROW's mean as a
    percentage of REF's ("77%"); several ids, comma-separated, are joined by " and "."""
    def figure(marker: re.Match) -> str:
        ids = [i.strip() for i in marker.group("ids").split(",")]
        pairs = [i.split("/") for i in ids]
        missing = [i for i, pair in zip(ids, pairs) if len(pair) != 2 or not set(pair) <= set(means)]
        if missing:
            raise ValueError(f"<!-- pct {marker.group('ids')} -->: no rows {', '.join(missing)} in the page's tables")
        shown = " and ".join(f"{100 * means[row] / means[reference]:.0f}%" for row, reference in pairs)
        return f"<!-- pct {marker.group('ids')} -->{shown}<!-- /pct -->"
    return PERCENT.sub(figure, text)


def cite(text: str, computed: dict[str, Comparison]) -> str:
    """The text with every cmp marker's clause written from the comparisons it names; ValueError naming an id the
    tables do not compute."""
    def clause(marker: re.Match) -> str:
        ids = [i.strip() for i in marker.group("ids").split(",")]
        missing = [i for i in ids if i not in computed]
        if missing:
            raise ValueError(f"<!-- cmp {marker.group('ids')} -->: no comparison {', '.join(missing)} in the page's "
                             "tables (results/tables.yaml declares each row's 'against')")
        return f"<!-- cmp {marker.group('ids')} -->{'; '.join(computed[i].clause() for i in ids)}<!-- /cmp -->"
    return CITATION.sub(clause, text)


def prose(text: str) -> str:
    """The page less its generated blocks and code blocks (what a person wrote)."""
    return re.sub(r"^```.*?^```", "", GENERATED.sub("", text), flags=re.DOTALL | re.MULTILINE)


def sentences(text: str) -> list[str]:
    """The prose's sentences: a table line is one, a paragraph or list item is split after . ! or ? before a
    capital, a bracket or markup (markers and inline code kept whole)."""
    found = []
    for block in re.split(r"\n\s*\n|\n(?=\s*[-*] |\d+\. |#)", prose(text)):
        lines = block.splitlines()
        found += [line for line in lines if line.lstrip().startswith("|")]
        paragraph = " ".join(line.strip() for line in lines if not line.lstrip().startswith("|"))
        found += [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z(*`\[<])", paragraph) if s.strip()]
    return found


def words_before(fragment: str) -> set[str]:
    """What the fragment claims: "higher", "lower", "null" and "mean" (the claim is said of the means)."""
    plain = re.sub(r"`[^`]*`|<!--.*?-->|\]\([^)]*\)", " ", fragment)
    claims = set()
    for kind, words in (("higher", HIGHER), ("lower", LOWER)):
        for found in re.finditer(rf"\b(?:{words})\b", plain):
            claims.add("null" if re.search(NEGATION, plain[:found.start()]) else kind)
    if re.search(rf"\b(?:{NULL})\b", plain):
        claims.add("null")
    if MEANS.search(plain):
        claims.add("mean")
    return claims


def agrees(claim: str, comparison: Comparison, of_means: bool) -> bool:
    """Whether a fragment's claim ("higher", "lower", "null") agrees with the comparison it cites."""
    if claim == "null":
        return comparison.direction() == "null"
    if of_means or comparison.direction() == "untested":
        return of_means and (comparison.difference > 0) == (claim == "higher")
    return comparison.direction() == claim


def disagreements(text: str, computed: dict[str, Comparison]) -> list[str]:
    """Each citation whose sentence's words disagree with what it cites (the words before the marker, back to the
    previous marker or the sentence's start), as "ID: WORD against VERDICT in: SENTENCE"."""
    found = []
    for sentence in sentences(text):
        start = 0
        for marker in CITATION.finditer(sentence):
            claims = words_before(sentence[start:marker.start()])
            start = marker.end()
            for i in (i.strip() for i in marker.group("ids").split(",")):
                if i not in computed:
                    found.append(f"{i}: no such comparison in: {sentence}")
                    continue
                for claim in sorted(claims - {"mean"}):
                    if not agrees(claim, computed[i], "mean" in claims):
                        found.append(f"{i}: '{claim}'{' of the means' if 'mean' in claims else ''} against "
                                     f"{computed[i].verdict} ({computed[i].difference:+.2f}) in: {sentence}")
    return found


def uncited(text: str) -> list[str]:
    """The sentences that compare rows (a word of HIGHER, LOWER or NULL, and a row named) with neither a cited
    comparison, nor a quoted one, nor the words of a description (DESCRIBED). In a sentence that cites, the words
    after its last citation are read the same way: a citation answers for the words before it (disagreements)."""
    def compares(fragment: str) -> bool:
        plain = re.sub(r"\]\([^)]*\)", "]", fragment)
        return bool(re.search(rf"\b(?:{HIGHER}|{LOWER}|{NULL})\b", plain) and ROWS.search(plain))

    def unanswered(sentence: str) -> str:
        *_, last = [None, *CITATION.finditer(sentence)]
        return sentence[last.end():] if last else sentence
    return [s for s in sentences(text)
            if compares(rest := unanswered(s)) and not (QUOTED.search(rest) or DESCRIBED.search(rest))]


def cite_files(page: Path, files: list[Path]) -> list[Path]:
    """Write every cmp marker of the page and of `files` from the page's tables; the files that changed."""
    computed, means, changed = comparisons(page.read_text("utf-8")), row_means(page.read_text("utf-8")), []
    for path in [page, *files]:
        text = path.read_text(encoding="utf-8")
        if (cited := cite_percentages(cite(text, computed), means)) != text:
            path.write_text(cited, encoding="utf-8")
            changed.append(path)
    return changed


def chance_uncited(text: str) -> list[str]:
    """The sentences that state a chance level, or a shortcut's share (a figure 0.x beside the word), without citing
    the shortcut check's figure."""
    def states(sentence: str) -> bool:
        return bool(CHANCE_LEVEL.search(sentence) or (SHORTCUT.search(sentence) and SHARE.search(sentence)))
    return [s for s in sentences(text) if states(s) and not CHANCE.search(s)]


def plain_words(sentence: str) -> str:  # a sentence less its inline code, markers and link targets
    return re.sub(r"`[^`]*`|<!--.*?-->|\]\([^)]*\)", " ", sentence)


def percent_uncited(text: str) -> list[str]:
    """The sentences that give one row as a percentage of another ("77% of sinusoids' score") outside a pct marker:
    a percentage of a row is computed from the table (cite_percentages), never written."""
    return [s for s in sentences(text) if PERCENT_OF_ROW.search(plain_words(PERCENT.sub(" ", s)))]


def unsupported_claims(text: str, computed: dict[str, Comparison]) -> list[str]:
    """Claims that need a test or a table, as "KIND: SENTENCE" (none where the sentence describes untested means or
    single runs): "superlative" ("the worst of the four": comparisons against N - 1 references, each that way),
    "gain" ("the gain of X over Y": a "higher" verdict), "universal" ("cannot", "only X differs", "every distance",
    "whatever k": cites what measured it), "recommendation" (every citation a null, and a recommendation on it that
    does not say what the null leaves open)."""
    found = []
    for sentence in sentences(text):
        plain = plain_words(sentence)
        if DESCRIBED.search(plain) or MEANS.search(plain):
            continue
        cited = [computed[i.strip()] for m in CITATION.finditer(sentence) for i in m.group("ids").split(",")
                 if i.strip() in computed]
        references = {i.strip().split("/")[1].split(".")[-1] for m in CITATION.finditer(sentence)
                      for i in m.group("ids").split(",") if "/" in i}
        if (most := SUPERLATIVE.search(plain)) and ROWS.search(plain):
            direction = "higher" if re.match(r"best|highest", most.group(0), re.IGNORECASE) else "lower"
            if len(references) < NUMBERS[most.group("n").lower()] - 1 or any(
                    c.direction() != direction for c in cited):
                found.append(f"superlative: {sentence}")
        if GAIN.search(plain) and ROWS.search(plain) and not any(c.direction() == "higher" for c in cited):
            found.append(f"gain: {sentence}")
        if UNIVERSAL.search(plain) and ROWS.search(plain) and not (cited or CHANCE.search(sentence)):
            found.append(f"universal: {sentence}")
        if cited and all(c.direction() == "null" for c in cited) and RECOMMENDS.search(plain) and not \
                HEDGED.search(plain):
            found.append(f"recommendation: {sentence}")
    return found
