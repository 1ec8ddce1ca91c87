r"""Answer-grading cases derived from other projects' grading tests and evaluation code (issue 15).

Written for rlrun: each case reproduces a situation that a peer project tests or handles
(its source: repository, path, commit in SOURCES), with our own numbers and wording. None
comes from math-verify's own test suite. tests/unit/test_reward_peer_cases.py scores them
with the reward service's verifier and with plain ``math_verify.verify`` on the raw response.

A case: ``Case(id, category, source, label, expected, response, contested=None)``

* ``label``: the reference answer as a dataset holds it;
* ``response``: the model's response, as /get_reward sees it once the prompt is cut off
  (chat end markers and all: OpenRLHF decodes with ``skip_special_tokens=False``);
* ``expected``: 1 correct, 0 wrong;
* ``contested``: set when the peer graders disagree with each other on the verdict (it says
  how). Such cases count in the per-category agreement, not in the ">= 97 % where the peers
  agree" target.
"""

from __future__ import annotations

from typing import NamedTuple


class Source(NamedTuple):
    repo: str
    path: str
    commit: str


_VERL = "b178a3cd56f58b2d502255daba591e92833930a7"
_LMEVAL = "4e7e0d47f33bc71070c1d38394bafbb52b117163"
_QWEN = "a45202bd16f1ec06f433442dc1152d0074773465"
_DEEPSEEK = "b8b0f8ce093d80bf8e9a641e44142f06d092c305"
_OPENRLHF = "3c3be6234e0cb353e76bb8019947db9dfe99fca7"

SOURCES: dict[str, Source] = {
    "hendrycks-equiv": Source("hendrycks/math", "modeling/math_equivalence_test.py",
                              "985bdc1696e88e8643f081a0ff4719da39f2ae2a"),
    "nemo-equal": Source("NVIDIA/NeMo-Skills", "tests/test_math_equal.py", "0b012df8a09cd4730d31b16e90a0d8f13d145fb8"),
    "lighteval-match": Source("huggingface/lighteval", "tests/unit/metrics/test_extractive_match.py",
                              "3fd15266bc8448b797e61462d293aa3fd40b3580"),
    "openr1-rewards": Source("huggingface/open-r1", "tests/test_rewards.py", "1416fa0cf21595d2083b399a2a0bbddd7f6e9563"),
    "verl-gsm8k": Source("volcengine/verl", "verl/utils/reward_score/gsm8k.py", _VERL),
    "verl-dapo": Source("volcengine/verl", "verl/utils/reward_score/math_dapo.py", _VERL),
    "verl-dapo-eos": Source("volcengine/verl", "verl/workers/reward_manager/dapo.py", _VERL),
    "lmeval-minerva": Source("EleutherAI/lm-evaluation-harness", "lm_eval/tasks/minerva_math/utils.py", _LMEVAL),
    "lmeval-gsm8k": Source("EleutherAI/lm-evaluation-harness", "lm_eval/tasks/gsm8k/gsm8k.yaml", _LMEVAL),
    "qwen-grader": Source("QwenLM/Qwen2.5-Math", "evaluation/grader.py", _QWEN),
    "qwen-parser": Source("QwenLM/Qwen2.5-Math", "evaluation/parser.py", _QWEN),
    "qwen-stop": Source("QwenLM/Qwen2.5-Math", "evaluation/math_eval.py", _QWEN),
    "prm800k-grader": Source("openai/prm800k", "prm800k/grading/grader.py", "7ecc794703b2877f63226f2477a49b34f9b25163"),
    "deepseek-eval": Source("deepseek-ai/DeepSeek-Math", "evaluation/eval/eval_utils.py", _DEEPSEEK),
    "deepseek-extract": Source("deepseek-ai/DeepSeek-Math", "evaluation/data_processing/answer_extraction.py", _DEEPSEEK),
    "simple-evals": Source("openai/simple-evals", "common.py", "ee3b0318d8d1d9d72755a4120879be65f7c07e9e"),
    "openrlhf-gen": Source("OpenRLHF/OpenRLHF", "openrlhf/trainer/ppo_utils/samples_generator.py", _OPENRLHF),
    "openrlhf-math": Source("OpenRLHF/OpenRLHF", "openrlhf/utils/math_utils.py", _OPENRLHF),
    "xdan-verifier": Source("xiechengmude/xDAN-RL-Training-GRPO", "openrlhf/models/remote_rm/math_verifier.py",
                            "111ee7e6dc938bd59c77028eee37b6d4e3e4f440"),
    # Issue 33's sources (units after an expression, styled letters, radicals, label defects).
    "verl-prime": Source("volcengine/verl", "verl/utils/reward_score/prime_math/__init__.py",
                         "35101b521f4b44242c700bb58c2a479f8a18dd06"),
    "verl-prime-grader": Source("volcengine/verl", "verl/utils/reward_score/prime_math/grader.py",
                                "23d62925c453fe48b5b8254a4cadfe7dc68e41bb"),
    "verl-dapo-norm": Source("volcengine/verl", "verl/utils/reward_score/math_dapo.py",
                             "012542c42542738709ccd0db619cff949cb0337a"),
    "lmeval-minerva-norm": Source("EleutherAI/lm-evaluation-harness", "lm_eval/tasks/minerva_math/utils.py",
                                  "0348ed975af5b6788c275445197287dd91acb221"),
    "qwen-strip": Source("QwenLM/Qwen2.5-Math", "evaluation/parser.py", "005449c4f8220b1af7db49aed0285d9901aefea0"),
    "openrlhf-mathd": Source("OpenRLHF/OpenRLHF", "openrlhf/utils/math_utils.py",
                             "160b08e43b14198731a3ddfef8abd44d23161494"),
    "deepseek-digits": Source("deepseek-ai/DeepSeek-Math", "evaluation/eval/eval_utils.py",
                              "21cc5c6701a708a11cee0af8b1fe884e3294dc7a"),
}  # fmt: skip

REQUIRED_CATEGORIES = (
    "chat_markers", "no_marker", "units", "percent", "intervals", "sets", "matrices", "equations", "thousands", "text",
    "letters", "radicals", "labels",
)  # fmt: skip


class Case(NamedTuple):
    id: str
    category: str
    source: str
    label: str
    expected: int
    response: str
    contested: str | None = None


C = Case
CASES: list[Case] = []
_add = CASES.append

# ---------------------------------------------------------------------- chat_markers
# OpenRLHF samples with skip_special_tokens=False, so the end-of-turn token stays in the query;
# verl's DAPO manager strips a trailing eos itself; lm-eval and Qwen2.5-Math stop generation on
# "</s>", "<|im_end|>", "<|endoftext|>"; the seed's remote verifier deletes three such markers.
for case in [
    C("cm01", "chat_markers", "openrlhf-gen", "4", 1, "Two pairs of socks are 2 * 2 = 4 socks.\n#### 4<|im_end|>"),
    C("cm02", "chat_markers", "openrlhf-gen", "5", 0, "Two pairs of socks are 2 * 2 = 4 socks.\n#### 4<|im_end|>"),
    C("cm03", "chat_markers", "verl-dapo-eos", "72", 1,
      "She sold 48 in April and half as many, 24, in May: 48 + 24 = 72.\nAnswer: 72<|endoftext|>"),
    C("cm04", "chat_markers", "verl-dapo-eos", "3/4", 1, "Adding the two parts gives 1/2 + 1/4.\nAnswer: 3/4</s>"),
    C("cm05", "chat_markers", "lmeval-gsm8k", "18", 1,
      "She eats 3 and bakes 4, so 16 - 3 - 4 = 9 eggs are sold at $2 each: 9 * 2 = 18.\n#### 18<|eot_id|>"),
    C("cm06", "chat_markers", "qwen-stop", r"\frac{1}{2}", 1,
      r"The probability is the ratio of favourable to total outcomes, so the answer is $\frac{1}{2}$.<|endoftext|>"),
    C("cm07", "chat_markers", "xdan-verifier", "10", 1,
      "A pentagonal prism has two pentagonal faces with 5 edges each and 5 lateral edges. "
      "Only the edges of the two pentagons were asked for. The answer is 10.<｜end▁of▁sentence｜>"),
    C("cm08", "chat_markers", "openrlhf-gen", "1200", 1,
      "The monthly cost is 100 dollars, so a year costs 12 * 100 = 1,200 dollars.\n#### 1,200<|im_end|>"),
    C("cm09", "chat_markers", "openrlhf-gen", "1200", 0,
      "The monthly cost is 100 dollars, so a year costs 12 * 100 = 1,200 dollars, minus the 10% discount.\n"
      "#### 1,080<|im_end|>"),
    C("cm10", "chat_markers", "verl-dapo-eos", "7", 1, "**Answer:** 7<|im_end|>"),
    C("cm11", "chat_markers", "openrlhf-gen", "42", 1,
      "Six rows of seven chairs make 42 chairs. The answer is 42<|im_end|><|endoftext|><|endoftext|><|endoftext|>"),
    C("cm12", "chat_markers", "openrlhf-gen", "42", 0,
      "Six rows of seven chairs make 42 chairs, but two are broken. The answer is 40<|im_end|><|endoftext|>"),
    C("cm13", "chat_markers", "openrlhf-gen", r"\sqrt{2}", 1,
      r"The diagonal of the unit square is $\boxed{\sqrt{2}}$.<|im_end|>"),
    C("cm14", "chat_markers", "lmeval-minerva", "24", 1,
      "We have $\\det(AB) = \\det A \\cdot \\det B = 2 \\cdot 12 = 24$.\n"
      "Final Answer: The final answer is $24$. I hope it is correct.<|im_end|>"),
    C("cm15", "chat_markers", "lmeval-minerva", r"-\frac{2}{3}", 1,
      "Multiplying the first equation by $-\\frac{3}{2}$ gives $b = -\\frac{3}{2}a$.\n"
      "Final Answer: The final answer is $-\\frac{2}{3}$. I hope it is correct.</s>"),
    C("cm16", "chat_markers", "openrlhf-gen", "9", 1,
      "100 = 7 * 13 + 9, so the remainder is 9.\n#### 9<|im_end|>\n<|im_start|>user\nNow divide 100 by 8.<|im_end|>"),
    C("cm17", "chat_markers", "openrlhf-gen", "25", 1,
      "<|im_start|>assistant\nFive nickels are 5 * 5 = 25 cents.\n#### 25<|im_end|>"),
    C("cm18", "chat_markers", "lmeval-gsm8k", "60", 1, "Three weeks at 20 dollars a week is 3 * 20 = 60.\n#### 60</s></s></s>"),
    C("cm19", "chat_markers", "lmeval-gsm8k", "60", 0,
      "Three weeks at 20 dollars a week is 3 * 20 = 60, plus the 15 he had.\n#### 75</s>"),
    C("cm20", "chat_markers", "verl-dapo-eos", "0.25", 1,
      "One of the four suits is hearts, so the probability is 0.25.\nAnswer: 0.25<|eot_id|>"),
    C("cm21", "chat_markers", "verl-dapo-eos", "-3", 1, "Solving 2x + 6 = 0 gives x = -3.\nAnswer: -3<|end|>"),
    C("cm22", "chat_markers", "qwen-stop", r"2\pi", 1,
      r"The period of $\sin x$ is $2\pi$, so the answer is $2\pi$<|endoftext|>"),
    C("cm23", "chat_markers", "xdan-verifier", "15", 1,
      "<think>\n5 + 10 = 15\n</think>\n<answer>The answer is 15.</answer><｜end▁of▁sentence｜>"),
    C("cm24", "chat_markers", "openrlhf-gen", "(2, 3)", 1,
      "Adding the equations gives x = 2, then y = 3, so the answer is $(2, 3)$.<|im_end|>"),
    C("cm25", "chat_markers", "openrlhf-gen", "(2, 3)", 0,
      "Adding the equations gives x = 3, then y = 2, so the answer is $(3, 2)$.<|im_end|>"),
    C("cm26", "chat_markers", "verl-dapo-eos", "12", 1, "The LCM of 4 and 6 is 12.\nAnswer: 12<end_of_turn>"),
    C("cm27", "chat_markers", "lmeval-gsm8k", "8", 1, "She has 5 apples and buys 3 more: 5 + 3 = 8.\n#### 8<|end_of_text|>"),
    C("cm28", "chat_markers", "openrlhf-gen", "100", 1, "Ten tens make one hundred.\nThe answer is: 100.<|im_end|>"),
    C("cm29", "chat_markers", "openrlhf-gen", "64", 0,
      "The cube of 4 is 4^3 = 64, and doubling gives 128.\n#### 128<|im_end|>"),
    C("cm30", "chat_markers", "verl-dapo-eos", "5", 1, "Answer: 5<|return|>"),
]:
    _add(case)

# ---------------------------------------------------------------------- no_marker
# No \boxed, "answer is" or "####": verl's gsm8k "flexible" mode and lm-eval's gsm8k
# "flexible-extract" take the last number, Qwen2.5-Math's extract_answer(use_last_number=True)
# too; lighteval's multilingual cases grade answers stated in the last sentence.
for case in [
    C("nm01", "no_marker", "verl-gsm8k", "18", 1,
      "Janet has 16 eggs, eats 3 and bakes 4, so 9 are left. She sells them at $2 each, making $18 every day."),
    C("nm02", "no_marker", "lighteval-match", "13", 1,
      "There were 3 birds and 4 storks, then 6 more storks came, so 3 + 4 + 6 = 13 birds and storks sit on the fence."),
    C("nm03", "no_marker", "lighteval-match", "3", 1,
      "The math homework has 5 pages and the reading 2 pages, so there are 5 - 2 = 3 more pages of math."),
    C("nm04", "no_marker", "lighteval-match", "858", 1, "26 bags with 33 candies each make 33 * 26 = 858 candies in total."),
    C("nm05", "no_marker", "lighteval-match", "192", 1,
      "She lost 126 kg and weighs 66 kg now, so before jogging she weighed 66 + 126 = 192 kg."),
    C("nm06", "no_marker", "lighteval-match", "70", 1,
      "The discount is 100 * 0.30 = 30 dollars, so the final cost is 100 - 30 = 70"),
    C("nm07", "no_marker", "lighteval-match", "4000", 1, "The plot yields 72000 / 18 = 4000 kilograms per hectare."),
    C("nm08", "no_marker", "lighteval-match", "300", 1,
      "12000 litres at 40 litres per minute take 12000 / 40 = 300 minutes to drain."),
    C("nm09", "no_marker", "verl-gsm8k", "12", 0,
      "Each costs 4 dollars, so 3 of them cost 12 dollars, and with the delivery fee 13 dollars."),
    C("nm10", "no_marker", "lighteval-match", "0", 1, "Dividing 9 by 3 gives 3, and taking 3 away leaves 0"),
    C("nm11", "no_marker", "qwen-parser", r"\frac{3}{4}", 1,
      r"Adding $\frac{1}{2}$ and $\frac{1}{4}$ gives $\frac{3}{4}$."),
    C("nm12", "no_marker", "lighteval-match", "2/5", 1,
      r"Each of the three parts weighs $\frac{6}{15} = \frac{2}{5}$ tons."),
    C("nm13", "no_marker", "qwen-parser", "5", 1, "Subtracting 3 from both sides gives 2x = 10. Therefore x = 5."),
    C("nm14", "no_marker", "qwen-parser", "7", 0, "Subtracting 3 from both sides gives 2x = 16. Therefore x = 8."),
    C("nm15", "no_marker", "lighteval-match", "13/28", 1, "The planned ratio is 13/28."),
    C("nm16", "no_marker", "lmeval-gsm8k", "0.4", 1, "Two of the five marbles are red, so the probability is .4"),
    C("nm17", "no_marker", "lighteval-match", "1000.99", 1, "The invoice total comes to €1,000.99."),
    C("nm18", "no_marker", "verl-gsm8k", "56", 1, "Half of the 112 students take the bus, that is 56."),
    C("nm19", "no_marker", "verl-gsm8k", "24", 0, "I am not sure how to finish this problem."),
    C("nm20", "no_marker", "lighteval-match", "11", 1, "Adding the three parts, $x = 5 + 5 + 1 = 11$"),
    C("nm21", "no_marker", "lighteval-match", "1/3", 1, r"Solving for the constant we get $k = \frac{1}{3}$"),
    C("nm22", "no_marker", "verl-gsm8k", "150", 1,
      "A 25% tip on a 120 dollar bill is 30 dollars, so the total is 150 dollars."),
    C("nm23", "no_marker", "verl-gsm8k", "150", 0,
      "A 25% tip on a 120 dollar bill is 30 dollars, so the total is 120 + 30 = 140 dollars."),
    C("nm24", "no_marker", "lmeval-gsm8k", "-5", 1, "Starting at 7 degrees and dropping 12 degrees leaves -5 degrees."),
    C("nm25", "no_marker", "lmeval-gsm8k", "2.5", 1, "The average speed is 10 km / 4 h = 2.5 km/h."),
    C("nm26", "no_marker", "qwen-parser", r"\sqrt{13}", 1,
      r"The distance is $\sqrt{(3-1)^2 + (5-2)^2} = \sqrt{13}$."),
    C("nm27", "no_marker", "qwen-parser", r"\sqrt{13}", 0,
      r"The distance is $\sqrt{(3-1)^2 + (5-1)^2} = \sqrt{20}$."),
]:
    _add(case)

# ---------------------------------------------------------------------- units
# hendrycks' test_units / test_dollars, NeMo's "17\text{ any text}", the unit lists of the
# Minerva normaliser (lm-eval, verl's DAPO), PRM800K's and Qwen2.5-Math's unit stripping,
# simple-evals' "give benefit of the doubt to units".
for case in [
    C("un01", "units", "hendrycks-equiv", "10", 1, r"So the total is $\boxed{10\text{ units}}$."),
    C("un02", "units", "hendrycks-equiv", "100", 0, r"So the total is $\boxed{10\text{ units}}$."),
    C("un03", "units", "nemo-equal", "17", 1, r"She has $\boxed{17\text{ apples}}$ left."),
    C("un04", "units", "simple-evals", "72", 1, "Each exterior angle of the regular pentagon measures 72 degrees, so the answer is 72 degrees."),
    C("un05", "units", "simple-evals", "64", 1, r"The area is $8 \cdot 8$, so the answer is $\boxed{64 \text{ square feet}}$."),
    C("un06", "units", "lmeval-minerva", "15", 1, r"The shaded triangle has area $\boxed{15\mbox{ cm}^2}$."),
    C("un07", "units", "lmeval-minerva", "125", 1, r"The distance is $\boxed{125\textnormal{ miles}}.$"),
    C("un08", "units", "hendrycks-equiv", "10", 1, r"The ticket costs $\boxed{\$10}$."),
    C("un09", "units", "nemo-equal", r"\$10", 1, r"The ticket costs $\boxed{10}$ dollars."),
    C("un10", "units", "lmeval-minerva", "90", 1, r"Therefore $\angle BAC = 50^\circ + 40^\circ = \boxed{90^\circ}$."),
    C("un11", "units", "lmeval-minerva", r"90^\circ", 1, r"Therefore $\angle BAC = \boxed{90}$ degrees."),
    C("un12", "units", "lmeval-minerva", "45", 0, r"Therefore $\angle BAC = \boxed{50^\circ}$."),
    C("un13", "units", "prm800k-grader", "4", 1, "The ladder reaches a height of 4 meters, so the answer is 4 meters."),
    C("un14", "units", "lmeval-minerva", "12", 1, r"The rope is $\boxed{12 \text{ m}}$ long."),
    C("un15", "units", "deepseek-extract", "5", 1, r"The radius is $\boxed{5 \mathrm{~cm}}$."),
    C("un16", "units", "qwen-parser", "60", 1, "120 miles in 2 hours.\nAnswer: 60 mph"),
    C("un17", "units", "qwen-parser", "60", 0, "130 miles in 2 hours.\nAnswer: 65 mph"),
    C("un18", "units", "prm800k-grader", "3", 1, r"Driving at 40 mph, it takes $\boxed{3\text{ hours}}$."),
    C("un19", "units", "hendrycks-equiv", "7.5", 1, r"The total is $\boxed{\$7.50}$."),
    C("un20", "units", "hendrycks-equiv", "7.5", 0, r"The total is $\boxed{\$7.05}$."),
    C("un21", "units", "lighteval-match", "20", 1, "The room is 4 m by 5 m, so the answer is 20 m^2."),
    C("un22", "units", "lmeval-minerva", "24", 1, r"The box holds $\boxed{24\text{ cm}^3}$."),
]:
    _add(case)

# ---------------------------------------------------------------------- percent
# hendrycks' test_percentage ("10\%" == "10"), NeMo's "10%" / "10\%", Qwen2.5-Math's and
# DeepSeek-Math's include_percentage (x, x/100 and 100x all accepted), PRM800K drops "%".
for case in [
    C("pc01", "percent", "hendrycks-equiv", r"10\%", 1, r"The rate rose by $\boxed{10}$ percent."),
    C("pc02", "percent", "nemo-equal", "10", 1, r"The rate rose by $\boxed{10\%}$."),
    C("pc03", "percent", "qwen-grader", r"25\%", 1, r"One outcome in four, that is $\boxed{25\%}$."),
    C("pc04", "percent", "qwen-grader", r"25\%", 1, r"One outcome in four: $\boxed{0.25}$.",
      contested="Qwen2.5-Math / DeepSeek-Math accept x/100 for x%; PRM800K and hendrycks compare 25 with 0.25"),
    C("pc05", "percent", "lighteval-match", r"28\%", 1,
      r"After Monday it is worth $.9x$, after Tuesday $.72x$, for a total loss of $\boxed{28\%}$."),
    C("pc06", "percent", "lighteval-match", r"28\%", 0, r"It keeps $\boxed{72\%}$ of its value."),
    C("pc07", "percent", "prm800k-grader", "20", 1, "The price went down by 20 percent, so the answer is 20 percent."),
    C("pc08", "percent", "nemo-equal", r"20\%", 1, "Four of the twenty students are absent.\nAnswer: 20%"),
    C("pc09", "percent", "nemo-equal", r"20\%", 0, "Five of the twenty students are absent.\nAnswer: 25%"),
    C("pc10", "percent", "hendrycks-equiv", r"12.5\%", 1, r"One eighth is $\boxed{12.5\%}$."),
    C("pc11", "percent", "hendrycks-equiv", "12.5", 1, r"One eighth is $\boxed{12.5\%}$."),
    C("pc12", "percent", "deepseek-eval", "0.125", 1, r"One eighth is $\boxed{12.5\%}$.",
      contested="DeepSeek-Math / Qwen2.5-Math accept 100x; PRM800K and hendrycks compare 0.125 with 12.5"),
    C("pc13", "percent", "qwen-grader", "50", 1, "Half of them passed, that is 50% of the class."),
    C("pc14", "percent", "verl-dapo-eos", r"15\%", 1, "The increase is 15%.<|im_end|>"),
    C("pc15", "percent", "verl-dapo-eos", r"15\%", 0, "The increase is 1.5%.<|im_end|>"),
    C("pc16", "percent", "lighteval-match", r"100\%", 1, r"Halving one error doubles the other, an increase of $\boxed{100\%}$."),
    C("pc17", "percent", "lighteval-match", "100", 1, r"Halving one error doubles the other, an increase of $\boxed{100\%}$."),
    C("pc18", "percent", "prm800k-grader", r"40\%", 1, r"The discount is $\frac{40}{100}$ of the price, i.e. $\boxed{40\%}$."),
    C("pc19", "percent", "prm800k-grader", "40", 0, r"The discount is $\boxed{4\%}$."),
    C("pc20", "percent", "nemo-equal", r"5\%", 1, r"The interest rate is $\boxed{5 \%}$ per year."),
    C("pc21", "percent", "deepseek-eval", r"5\%", 1, r"The interest rate is $\boxed{0.05}$ per year.",
      contested="DeepSeek-Math / Qwen2.5-Math accept x/100 for x%; PRM800K compares 5 with 0.05"),
    C("pc22", "percent", "qwen-grader", r"75\%", 1, "Three of four, so the answer is 75 percent."),
]:
    _add(case)

# ---------------------------------------------------------------------- intervals
# lm-eval's Minerva few-shot answer "[2,5)", lighteval's interval and union cases, Qwen2.5-Math's
# bracket handling, PRM800K's rule that the brackets of a tuple/interval must match.
for case in [
    C("iv01", "intervals", "lmeval-minerva", "[2,5)", 1,
      r"Both radicands must be non-negative and the denominator non-zero, so the domain is $\boxed{[2,5)}$."),
    C("iv02", "intervals", "prm800k-grader", "[2,5)", 0, r"So the domain is $\boxed{[2,5]}$."),
    C("iv03", "intervals", "prm800k-grader", "[2,5)", 0, r"So the domain is $\boxed{(2,5)}$."),
    C("iv04", "intervals", "qwen-grader", r"(-\infty, 3]", 1, r"Hence $x \le 3$, i.e. $\boxed{(-\infty,3]}$."),
    C("iv05", "intervals", "prm800k-grader", r"(-\infty, 3]", 0, r"Hence $\boxed{(-\infty,3)}$."),
    C("iv06", "intervals", "lighteval-match", "[-4, 0]", 1,
      r"Thus, the values of \( k \) for which the quadratic has real roots are: \[ \boxed{[-4, 0]} \]"),
    C("iv07", "intervals", "lighteval-match", r"(2, 12) \cup (12, 102)", 1,
      r"Thus, the answer is $x \in \boxed{(2,12) \cup (12,102)}$"),
    C("iv08", "intervals", "lighteval-match", r"(2, 12) \cup (12, 102)", 0, r"Thus, the answer is $\boxed{(2,102)}$"),
    C("iv09", "intervals", "lighteval-match", "[0, 1)", 1,
      r"The numerator needs $x \ge 0$ and the denominator $1 - x > 0$, so the solution set is $x \in [0,1)$."),
    C("iv10", "intervals", "lmeval-minerva", "(-6, 10)", 1,
      r"The solution to the inequality is \( x \in (-6, 10) \). Final Answer: The final answer is \((-6, 10)\). I hope it is correct."),
    C("iv11", "intervals", "prm800k-grader", "[-3, 2]", 0, r"The expression under the root is non-negative on $\boxed{[-3,2)}$."),
    C("iv12", "intervals", "qwen-grader", r"(\frac{3}{5}, \frac{8}{3}]", 1, r"$\boxed{\left(\frac35, \frac83\right]}$"),
    C("iv13", "intervals", "qwen-grader", r"(1, \infty)", 1, r"The range is $\boxed{(1,\infty)}$."),
    C("iv14", "intervals", "lighteval-match", r"(1, \infty)", 1, r"The inequality holds exactly when $\boxed{x > 1}$.",
      contested="lighteval reads an inequality as the interval it describes; Qwen2.5-Math and hendrycks compare the strings"),
    C("iv15", "intervals", "lighteval-match", r"[-1, -\frac{1}{2}) \cup (-\frac{1}{2}, 0) \cup (0, 1) \cup (1, \infty)", 1,
      r"The solution set is $\boxed{[-1, -\tfrac12) \cup (-\tfrac12, 0) \cup (0, 1) \cup (1, \infty)}.$"),
    C("iv16", "intervals", "qwen-grader", r"[5, \infty)", 1, r"So $x \ge 5$, i.e. $x \in \boxed{[5, \infty)}$."),
    C("iv17", "intervals", "prm800k-grader", r"[5, \infty)", 0, r"So $x > 5$, i.e. $\boxed{(5, \infty)}$."),
    C("iv18", "intervals", "qwen-grader", r"(-\infty, -2) \cup (3, \infty)", 1, r"$\boxed{(-\infty,-2)\cup(3,\infty)}$"),
    C("iv19", "intervals", "qwen-grader", r"(-\infty, -2) \cup (3, \infty)", 0, r"$\boxed{(-2, 3)}$"),
    C("iv20", "intervals", "qwen-grader", r"[0, 2\pi)", 1, r"One full turn: $\boxed{[0,2\pi)}$."),
    C("iv21", "intervals", "openrlhf-gen", r"(-\infty, 3]", 1, r"The answer is $(-\infty, 3]$<|im_end|>"),
]:
    _add(case)

# ---------------------------------------------------------------------- sets
# hendrycks' test_order / test_order2 (order of listed answers), lighteval's root lists and
# sets of tuples, NeMo's "\sqrt{67},-\sqrt{85}" vs "\sqrt{67}", PRM800K's tuple splitting.
for case in [
    C("st01", "sets", "lighteval-match", r"\{1, 2, 3\}", 1, r"$\boxed{\{3, 2, 1\}}$"),
    C("st02", "sets", "lighteval-match", r"\{1, 2, 3\}", 0, r"$\boxed{\{1, 2\}}$"),
    C("st03", "sets", "lighteval-match", "-2, 1", 1,
      r"Checking the divisors of 14, the only integer roots are $\boxed{-2,1}.$"),
    C("st04", "sets", "hendrycks-equiv", "-2, 1", 1, r"The integer roots are $\boxed{1, -2}$.",
      contested="hendrycks compares listed answers in order (its test_order); lighteval / math-verify as a set"),
    C("st05", "sets", "hendrycks-equiv", "10, 4, -2", 0, r"$\boxed{4, 12, -2}$"),
    C("st06", "sets", "lighteval-match", r"\{1\pm\sqrt{5}, -2\}", 1,
      r"The roots of $P$ are $-2$ and $1 \pm \sqrt{5}$, so the answer is $\boxed{\{-2, 1+\sqrt5, 1-\sqrt5\}}$."),
    C("st07", "sets", "lighteval-match", r"1 \pm \sqrt{19}", 1,
      r"By the quadratic formula, $x = \boxed{1 \pm \sqrt{19}}.$"),
    C("st08", "sets", "lighteval-match", r"1 \pm \sqrt{19}", 0, r"By the quadratic formula, $x = \boxed{1 + \sqrt{19}}.$"),
    C("st09", "sets", "lighteval-match", r"\{-1\} \cup [0, 7)", 1, r"x \in \boxed{\{-1\} \cup [0,7)}.$"),
    C("st10", "sets", "lighteval-match", "3, 5, 7", 1, r"The primes are $\boxed{3}$, $\boxed{5}$ and $\boxed{7}$.",
      contested="lighteval joins boxes listed with 'and'; Qwen2.5-Math, DeepSeek-Math and verl take the last box only"),
    C("st11", "sets", "nemo-equal", "2, 3", 0, r"$\boxed{2, 3, 5}$"),
    C("st12", "sets", "lighteval-match", "(1, 2), (2, 1)", 1, r"The solutions are $\boxed{(2,1), (1,2)}$."),
    C("st13", "sets", "lighteval-match", "(1, 2), (2, 1)", 0, r"The only solution is $\boxed{(1,2)}$."),
    C("st14", "sets", "lighteval-match", "-12, -11, -10", 1, r"$\boxed{\{-10, -11, -12\}}$"),
    C("st15", "sets", "lighteval-match", r"\{0, 1\}", 1, r"Factoring $x(x-1) = 0$, the solutions are $x=0$ and $x=1$."),
    C("st16", "sets", "nemo-equal", r"\{2, 4, 6\}", 0, r"$\boxed{\{2,4,6,8\}}$"),
    C("st17", "sets", "lmeval-minerva", "6, 8", 1, r"The two sides are $\boxed{6 \text{ and } 8}$."),
    C("st18", "sets", "lighteval-match", r"\{1, 2\}", 1, r"$\boxed{1,2}$"),
    C("st19", "sets", "lighteval-match", "-1, 1", 1, r"So $x^2 = 1$ and $x = \boxed{\pm 1}$."),
    C("st20", "sets", "nemo-equal", r"\sqrt{67}, -\sqrt{85}", 0, r"$\boxed{\sqrt{67}}$"),
    C("st21", "sets", "qwen-parser", "1, 2, 3", 1, "Trying the divisors of 6, so the answer is 1, 2, 3."),
]:
    _add(case)

# ---------------------------------------------------------------------- matrices
# NeMo's pmatrix vs bmatrix, Qwen2.5-Math's / DeepSeek-Math's element-wise matrix comparison,
# lighteval's matrix extraction cases (array environments, vectors, a wrong entry).
for case in [
    C("mx01", "matrices", "lighteval-match", r"\begin{pmatrix} 1 & 0 \\ 0 & 1 \end{pmatrix}", 1,
      r"The identity is $\boxed{\begin{pmatrix}1&0\\0&1\end{pmatrix}}$."),
    C("mx02", "matrices", "nemo-equal", r"\begin{pmatrix}0&0&0\\0&1&0\\0&0&1\end{pmatrix}", 1,
      r"$\boxed{\begin{bmatrix} 0 & 0 & 0 \\ 0 & 1 & 0 \\ 0 & 0 & 1 \end{bmatrix}}$"),
    C("mx03", "matrices", "lighteval-match", r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}", 0,
      r"$\boxed{\begin{pmatrix} 1 & 2 \\ 3 & 5 \end{pmatrix}}$"),
    C("mx04", "matrices", "lighteval-match", r"\begin{pmatrix} 3 \\ 2 \\ -6 \end{pmatrix}", 1,
      r"The direction vector is $\boxed{\begin{pmatrix} 3 \\ 2 \\ -6 \end{pmatrix}}$."),
    C("mx05", "matrices", "qwen-grader", r"\begin{pmatrix} 3 \\ 2 \\ -6 \end{pmatrix}", 0,
      r"The direction vector is $\boxed{\begin{pmatrix} -3 \\ -2 \\ 6 \end{pmatrix}}$."),
    C("mx06", "matrices", "lighteval-match",
      r"\begin{pmatrix} \frac{1}{2} & \frac{3}{4} \\ \frac{5}{6} & \frac{7}{8} \end{pmatrix}", 1,
      r"$\boxed{\begin{pmatrix}\dfrac{1}{2} & \dfrac{3}{4} \\ \dfrac{5}{6} & \dfrac{7}{8}\end{pmatrix}}$"),
    C("mx07", "matrices", "qwen-grader", r"\begin{pmatrix} 1/2 \\ 1/4 \end{pmatrix}", 1,
      r"$\boxed{\begin{pmatrix} 0.5 \\ 0.25 \end{pmatrix}}$"),
    C("mx08", "matrices", "lighteval-match", r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}", 1,
      r"$\boxed{\left[\begin{array}{cc}1 & 2 \\3 & 4\end{array}\right]}$"),
    C("mx09", "matrices", "qwen-grader", r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}", 0,
      r"$\boxed{\begin{pmatrix} 1 & 2 & 3 & 4 \end{pmatrix}}$"),
    C("mx10", "matrices", "lighteval-match", r"\begin{pmatrix} 0 & 3 \\ 0 & -1 \end{pmatrix}", 1,
      "Therefore\n\\[\\mathbf{M} = \\boxed{\n\\begin{pmatrix} 0 & 3 \\\\ 0 & -1 \\end{pmatrix}\n}.\\]"),
    C("mx11", "matrices", "qwen-grader", r"\begin{pmatrix} -\frac{7}{4} & -2 \\ 4 & \frac{1}{4} \end{pmatrix}", 1,
      r"$\boxed{\begin{pmatrix}-\frac{7}{4}&-2\\4&\frac{1}{4}\\\end{pmatrix}}$"),
    C("mx12", "matrices", "lighteval-match", r"\begin{pmatrix} 2 \\ -1 \end{pmatrix}", 1,
      r"The projection is the vector $\begin{pmatrix} 2 \\ -1 \end{pmatrix}$."),
    C("mx13", "matrices", "nemo-equal", r"\begin{pmatrix} 6 & 8 \\ 10 & 12 \end{pmatrix}", 1,
      r"Adding entry by entry: $\boxed{\begin{pmatrix} 6 & 8 \\ 10 & 12 \end{pmatrix}}$.<|im_end|>"),
    C("mx14", "matrices", "qwen-grader", r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", 0,
      r"$\boxed{\begin{pmatrix} 2 \\ 1 \end{pmatrix}}$"),
    C("mx15", "matrices", "deepseek-eval", r"\begin{pmatrix} 1 & 1 \\ 0 & 1 \end{pmatrix}", 1,
      "Squaring the shear matrix twice.\nAnswer: $\\begin{pmatrix} 1 & 1 \\\\ 0 & 1 \\end{pmatrix}$"),
    C("mx16", "matrices", "lighteval-match", r"\begin{pmatrix} 0 & 0 \\ 0 & 0 \end{pmatrix}", 1,
      r"$\boxed{\begin{bmatrix}0&0\\0&0\end{bmatrix}}$"),
    C("mx17", "matrices", "deepseek-eval", r"\begin{pmatrix} 1 \\ 0 \\ 0 \end{pmatrix}", 0,
      r"$\boxed{\begin{pmatrix} 0 \\ 1 \\ 0 \end{pmatrix}}$"),
    C("mx18", "matrices", "qwen-grader", r"\begin{pmatrix} 2 & 0 \\ 0 & 2 \end{pmatrix}", 1,
      r"Doubling the identity gives $\boxed{\begin{pmatrix} 2 & 0 \\ 0 & 2 \end{pmatrix}}$"),
]:
    _add(case)

# ---------------------------------------------------------------------- equations
# hendrycks' test_expression (two different planes), NeMo's "y = x^2+2x+1" vs "2x+ 1+x^2",
# Qwen2.5-Math's equation rule (lhs - rhs equal up to sign; "x = 5" vs "5"), lighteval's
# relation cases.
for case in [
    C("eq01", "equations", "qwen-grader", "y = 2x + 3", 1, r"The line is $\boxed{y = 3 + 2x}$."),
    C("eq02", "equations", "qwen-grader", "y = 2x + 3", 0, r"The line is $\boxed{y = 2x - 3}$."),
    C("eq03", "equations", "qwen-grader", "5", 1, r"$\boxed{x = 5}$"),
    C("eq04", "equations", "qwen-grader", "x = 5", 1, r"$\boxed{5}$"),
    C("eq05", "equations", "hendrycks-equiv", "5x - 7y + 11z + 4 = 0", 0, r"$\boxed{x + y - z + 2 = 0}$"),
    C("eq06", "equations", "qwen-grader", "34x + 45y - 20z + 100 = 0", 1,
      r"The plane is $\boxed{-34x-45y+20z-100=0}$."),
    C("eq07", "equations", "lighteval-match", "1/3", 1, r"Comparing coefficients, $k = \boxed{\frac{1}{3}}$."),
    C("eq08", "equations", "nemo-equal", "y = x^2 + 2x + 1", 1, r"$\boxed{2x + 1 + x^2}$"),
    C("eq09", "equations", "lighteval-match", "x - 2y + z - 1 = 0", 1, r"The plane is $\boxed{x - 2y + z = 1}$."),
    C("eq10", "equations", "lighteval-match", "x - 2y + z - 1 = 0", 0, r"The plane is $\boxed{x - 2y + z = -1}$."),
    C("eq11", "equations", "lighteval-match", "11", 1, r"The answer is $x = 5 + 5 + 1 = 11$."),
    C("eq12", "equations", "qwen-grader", "y = -2x + 4", 1, r"The line is $\boxed{2x + y = 4}$."),
    C("eq13", "equations", "qwen-grader", "y = -2x + 4", 0, r"The line is $\boxed{y = -2x - 4}$."),
    C("eq14", "equations", "lighteval-match", "p = 5, q = 2", 1, r"$\boxed{(5, 2)}$",
      contested="lighteval matches the values of an assignment list with a tuple; Qwen2.5-Math compares strings"),
    C("eq15", "equations", "qwen-parser", "x = 2", 1, r"Solving $3x - 1 = 5$ gives $x = 2$."),
    C("eq16", "equations", "qwen-grader", "a = 4", 1, r"$\boxed{a=4}$"),
    C("eq17", "equations", "qwen-grader", "a = 4", 0, r"$\boxed{a=-4}$"),
    C("eq18", "equations", "qwen-grader", "x^2 + y^2 = 25", 1, r"The circle is $\boxed{x^2+y^2=25}$."),
    C("eq19", "equations", "qwen-grader", "x^2 + y^2 = 25", 0, r"The circle is $\boxed{x^2+y^2=5}$."),
    C("eq20", "equations", "qwen-grader", "x^2 + y^2 = 25", 1, r"The circle is $\boxed{y^2 + x^2 - 25 = 0}$."),
]:
    _add(case)

# ---------------------------------------------------------------------- thousands
# lighteval's thousands-separator cases ("7,425,000", "1 000", "14{,}916", "32,\! 349"),
# PRM800K's _strip_properly_formatted_commas, verl's gsm8k strict regex (commas removed),
# lm-eval's gsm8k regexes_to_ignore ",".
for case in [
    C("th01", "thousands", "lighteval-match", "7425000", 1, r"So the population is $\boxed{7,425,000}$."),
    C("th02", "thousands", "lighteval-match", "1000", 1, "So the answer is 1 000.",
      contested="lighteval reads '1 000' as a thousand; PRM800K's mixed-number rule reads it as 1 + 000"),
    C("th03", "thousands", "lighteval-match", "14916", 1, r"Therefore, $\boxed{14{,}916}$ is our answer."),
    C("th04", "thousands", "lighteval-match", "32349", 1, r"The sum is $\boxed{32,\! 349}$"),
    C("th05", "thousands", "lighteval-match", "11111111100", 1, r"is $\boxed{11,\!111,\!111,\!100}$"),
    C("th06", "thousands", "prm800k-grader", "1000", 0, r"$\boxed{1,001}$"),
    C("th07", "thousands", "lighteval-match", "1000.99", 1, r"$\boxed{1,000.99}$"),
    C("th08", "thousands", "verl-gsm8k", "12000003", 1, "12 million and three is 12,000,003.\n#### 12,000,003"),
    C("th09", "thousands", "lmeval-gsm8k", "1234567", 1, "The answer is 1,234,567."),
    C("th10", "thousands", "lmeval-gsm8k", "1234567", 0, "The answer is 1,234,576."),
    C("th11", "thousands", "verl-gsm8k", "5280", 1, "A mile is 5,280 feet.\n#### 5,280"),
    C("th12", "thousands", "prm800k-grader", "2,500", 1, r"$\boxed{2500}$"),
    C("th13", "thousands", "prm800k-grader", "2,500", 0, r"$\boxed{25000}$"),
    C("th14", "thousands", "qwen-grader", "1000000", 1, r"$\boxed{10^6}$"),
    C("th15", "thousands", "prm800k-grader", "1000000", 1, "That is a thousand thousands, so the answer is 1 million.",
      contested="PRM800K reads 'million' as *10^6; Qwen2.5-Math and hendrycks do not"),
    C("th16", "thousands", "verl-gsm8k", "3,600", 1, "An hour has 60 * 60 = 3,600 seconds.\n#### 3,600<|im_end|>"),
    C("th17", "thousands", "lighteval-match", "16386.20", 1, r"After five years she has $\boxed{\$16,386.20}$."),
    C("th18", "thousands", "lighteval-match", "16386.20", 0, r"After five years she has $\boxed{\$16,368.20}$."),
    C("th19", "thousands", "simple-evals", "45000", 1, "Three years at 15,000 each.\nAnswer: $45,000"),
    C("th20", "thousands", "lighteval-match", "4,000", 1, "The harvest is 72,000 / 18 = 4,000 kilograms."),
]:
    _add(case)

# ---------------------------------------------------------------------- text
# lighteval's "\text{Evelyn}", "odd" / "\text{odd}", "(C)" vs "C", "d" vs "\text{E}"; NeMo's
# "\mathrm{E}", "\textbf{A}", "odd" vs "\text{oddd}"; PRM800K lowercases text answers.
for case in [
    C("tx01", "text", "lighteval-match", r"\text{Evelyn}", 1,
      r"Evelyn covered more distance in less time, therefore $\boxed{\text{Evelyn}}$ is our answer."),
    C("tx02", "text", "lighteval-match", r"\text{Evelyn}", 0, r"Therefore $\boxed{\text{Carla}}$ is our answer."),
    C("tx03", "text", "nemo-equal", "odd", 0, r"$\boxed{\text{oddd}}$"),
    C("tx04", "text", "lighteval-match", r"\text{odd}", 1, r"The function is $\boxed{odd}$."),
    C("tx05", "text", "nemo-equal", "E", 1, r"$\boxed{\mathrm{E}}$"),
    C("tx06", "text", "nemo-equal", "A", 1, r"$\boxed{\textbf{A}}$"),
    C("tx07", "text", "lighteval-match", r"\text{(C)}", 1, r"$\boxed{\text{C}}$."),
    C("tx08", "text", "qwen-parser", "C", 1, "Only the third option fits, so the answer is (C)."),
    C("tx09", "text", "qwen-parser", "C", 0, "Only the second option fits, so the answer is (B)."),
    C("tx10", "text", "lighteval-match", r"\text{Even}", 1, r"$\boxed{Even}$"),
    C("tx11", "text", "prm800k-grader", "Monday", 1, r"So the meeting falls on $\boxed{\text{Monday}}$."),
    C("tx12", "text", "prm800k-grader", "Monday", 0, r"So the meeting falls on $\boxed{\text{Tuesday}}$."),
    C("tx13", "text", "lighteval-match", "d", 0, r"$\boxed{\text{E}}$"),
    C("tx14", "text", "prm800k-grader", r"\text{yes}", 1, r"$\boxed{\text{Yes}}$"),
    C("tx15", "text", "prm800k-grader", "no", 0, r"$\boxed{\text{yes}}$"),
    C("tx16", "text", "verl-dapo-eos", r"\text{B}", 1, "The second graph is the only one that passes.\nAnswer: B<|im_end|>"),
    C("tx17", "text", "prm800k-grader", r"\text{Hexagon}", 1, r"It has six sides: $\boxed{\text{hexagon}}$."),
    C("tx18", "text", "prm800k-grader", r"\text{Hexagon}", 0, r"It has five sides: $\boxed{\text{pentagon}}$."),
    C("tx19", "text", "qwen-grader", "A", 1, r"The correct option is $\boxed{A}$."),
    C("tx20", "text", "simple-evals", r"\text{June}", 1, "Four months after February, so the answer is June."),
    C("tx21", "text", "simple-evals", r"\text{June}", 0, "Five months after February, so the answer is July."),
]:
    _add(case)

# ---------------------------------------------------------------------- numbers
# hendrycks' test_half / test_decimals2 / test_tfrac / test_frac, NeMo's (5, 5.0), ("918\frac{1}{2}",
# 918.5), (".185", "0.185") and (5, 5.001), open-r1's 63/400 cases, PRM800K's unreduced-fraction
# rule, simple-evals' "3245/5 vs 649: no non-trivial simplification".
for case in [
    C("nb01", "numbers", "hendrycks-equiv", "0.5", 1, r"$\boxed{\frac{1}{2}}$"),
    C("nb02", "numbers", "hendrycks-equiv", r"\frac{1}{2}", 1, r"$\boxed{1/2}$"),
    C("nb03", "numbers", "nemo-equal", "918.5", 1, r"$\boxed{918\frac{1}{2}}$"),
    C("nb04", "numbers", "nemo-equal", "0.185", 1, r"$\boxed{.185}$"),
    C("nb05", "numbers", "hendrycks-equiv", r"\frac{8}{3}", 1, r"$\boxed{\tfrac83}$"),
    C("nb06", "numbers", "hendrycks-equiv", r"\frac{3}{4}i", 1, r"$\boxed{\frac34i}$"),
    C("nb07", "numbers", "nemo-equal", "5", 1, r"$\boxed{5.0}$"),
    C("nb08", "numbers", "nemo-equal", "5", 0, r"$\boxed{5.001}$"),
    C("nb09", "numbers", "prm800k-grader", r"\frac{1}{2}", 1, r"$\boxed{\frac{2}{4}}$",
      contested="PRM800K and hendrycks refuse unreduced fractions; Qwen2.5-Math / math-verify compare values"),
    C("nb10", "numbers", "simple-evals", "649", 1, r"$\boxed{\frac{3245}{5}}$",
      contested="simple-evals' judge refuses non-trivial simplification; sympy-based graders accept"),
    C("nb11", "numbers", "openr1-rewards", r"\frac{63}{400}", 1, r"$\boxed{\frac{63}{400}}$"),
    C("nb12", "numbers", "openr1-rewards", r"\frac{63}{400}", 0, r"$\boxed{\frac{64}{400}}$"),
    C("nb13", "numbers", "openr1-rewards", "6", 0, r"$\boxed{3}$"),
    C("nb14", "numbers", "lighteval-match", r"-\frac{10}{9}", 1, r"$\boxed{-10/9}$"),
    C("nb15", "numbers", "qwen-grader", r"\frac{1}{12}", 1, r"$\boxed{0.0833333333333333}$"),
    C("nb16", "numbers", "qwen-grader", r"\frac{1}{3}", 0, r"$\boxed{0.33}$"),
    C("nb17", "numbers", "hendrycks-equiv", "0.1", 1, r"$\boxed{.1}$"),
    C("nb18", "numbers", "nemo-equal", "-5", 1, r"$\boxed{-5}$"),
    C("nb19", "numbers", "lighteval-match", "2.74", 0, r"$\boxed{2.47}$"),
    C("nb20", "numbers", "qwen-grader", "3.5", 1, r"$\boxed{\frac{7}{2}}$"),
    C("nb21", "numbers", "hendrycks-equiv", r"\frac{1}{2} + \frac{1}{72}", 1, r"$\boxed{\dfrac{1}{2} +\! \frac1{72}}$"),
    C("nb22", "numbers", "hendrycks-equiv", r"\frac{1}{2} + \frac{1}{72}", 0, r"$\boxed{\frac{1}{2} + 2/3}$"),
]:
    _add(case)

# ---------------------------------------------------------------------- expressions
# hendrycks' test_parentheses / test_sqrt, NeMo's x^2+2x+1 forms and (r+5)^2, Qwen2.5-Math's
# _test_math_equal list (sec^2, (a+5)(b+2) vs (+5)(b+2), golden ratio vs 2), lighteval's
# symbolic cases.
for case in [
    C("ex01", "expressions", "nemo-equal", "x^2+2x+1", 1, r"$\boxed{(x+1)^2}$"),
    C("ex02", "expressions", "nemo-equal", "x^2+2x+1", 0, r"$\boxed{x^3+2x+1}$"),
    C("ex03", "expressions", "nemo-equal", r"\frac{\sqrt{3}}{3}", 1, r"$\boxed{\frac{1}{\sqrt{3}}}$"),
    C("ex04", "expressions", "hendrycks-equiv", "(x-2)(x+2)", 1, r"$\boxed{\left(x-2\right)\left(x+2\right)}$"),
    C("ex05", "expressions", "hendrycks-equiv", r"10\sqrt{3} + \sqrt{4}", 1, r"$\boxed{10\sqrt3 + \sqrt{4}}$"),
    C("ex06", "expressions", "nemo-equal", "(r+5)^2", 1, r"$\boxed{(r+5)(r+5)}$"),
    C("ex07", "expressions", "qwen-grader", r"\sec^2 y", 1, r"$\boxed{\tan^2(y)+1}$"),
    C("ex08", "expressions", "lighteval-match", r"2 \sin b \cos a", 1,
      r"By sum-to-product, $\sin(a+b) - \sin(a-b) = \boxed{2\cos a \sin b}$."),
    C("ex09", "expressions", "qwen-grader", "(a+5)(b+2)", 0, r"$\boxed{(+5)(b+2)}$"),
    C("ex10", "expressions", "qwen-grader", "2", 0, r"$\boxed{\frac{1+\sqrt{5}}{2}}$"),
    C("ex11", "expressions", "lighteval-match", r"3\sqrt{13}", 1,
      r"By the distance formula, $\sqrt{6^2 + 9^2} = \boxed{\sqrt{117}}$."),
    C("ex12", "expressions", "qwen-grader", "x+2n+1", 0, r"$\boxed{x+1}$"),
    C("ex13", "expressions", "qwen-grader", r"\frac{x+2}{7}", 1, r"$\boxed{\frac{x}{7}+\frac{2}{7}}$"),
    C("ex14", "expressions", "lighteval-match", r"\frac{\pi r}{h+r}", 1, r"$\boxed{\frac{\pi r}{r+h}}$"),
    C("ex15", "expressions", "lighteval-match", r"\frac{9}{4}\pi", 1, r"Therefore $\boxed{\frac94\pi}$."),
    C("ex16", "expressions", "lighteval-match", r"\sqrt{2}+\sqrt{5}", 1, r"The answer is $\boxed{\sqrt 2+\sqrt 5}$"),
    C("ex17", "expressions", "deepseek-eval", "e^{2}", 1, r"$\boxed{e^2}$"),
    C("ex18", "expressions", "deepseek-eval", r"\pi/4", 1, r"$\boxed{\frac{\pi}{4}}$"),
    C("ex19", "expressions", "deepseek-eval", r"\pi/4", 0, r"$\boxed{\frac{\pi}{2}}$"),
    C("ex20", "expressions", "qwen-grader", r"1\sqrt{19}", 0, r"$\boxed{1}$"),
    C("ex21", "expressions", "lighteval-match", r"\frac{5\sqrt{42}}{27}", 1, r"$\boxed{\frac{5\sqrt{42}}{27}}$"),
    C("ex22", "expressions", "qwen-grader", "4", 0, r"$\boxed{\frac{34}{16}+\frac{\sqrt{1358}}{16}}$"),
]:
    _add(case)

# ---------------------------------------------------------------------- long and messy responses
# Real model outputs are long, correct themselves, repeat the answer, hedge, or trail off:
# lighteval's long "edge cases" (Final Answer repeated with notes after it), the Minerva
# "final answer is ... I hope it is correct" format, Qwen2.5-Math's "he answer is" / last-number
# rules, simple-evals' "Answer: " line, R1-style <think> blocks (the seed's verifier format).
for case in [
    C("lm01", "no_marker", "qwen-parser", "5", 1,
      "First I get x = 4. Wait, that drops the constant: 2x + 1 = 11 gives 2x = 10, so x = 5."),
    C("lm02", "no_marker", "qwen-parser", "5", 0,
      "First I get x = 5. Wait, that drops the constant: 2x + 3 = 11 gives 2x = 8, so x = 4."),
    C("lm03", "no_marker", "lighteval-match", "42", 1, "The total is 42 apples. Hope this helps!"),
    C("lm04", "no_marker", "simple-evals", "12", 1,
      "Three packs of four cups each.\nSo the answer should be 12."),
    C("lm05", "no_marker", "simple-evals", "12", 1, "Three packs of four cups each, so the final result is 12."),
    C("lm06", "no_marker", "qwen-parser", "5", 1, "解：2x + 1 = 11，所以 x = 5。答案是 5"),
    C("lm07", "chat_markers", "xdan-verifier", "10", 1,
      "<|im_start|>assistant\n<think>\nFive pairs of gloves: 5 + 5 = 10 gloves.\n</think>\n\n"
      "The answer is $\\boxed{10}$<|im_end|>"),
    C("lm08", "chat_markers", "xdan-verifier", "10", 0,
      "<think>\nThe answer is 10? No: each pair has 2 gloves and there are 6 pairs, 12 gloves.\n</think>\n"
      "There are 12 gloves.<｜end▁of▁sentence｜>"),
    C("lm09", "text", "lmeval-minerva", r"28\%", 1,
      "It keeps 90% then 80% of that, 72% in all.\nFinal Answer: The final answer is $28\\%$. I hope it is correct.\n"
      "Note: the solution above is correct. If you have any questions, feel free to ask. Thank you!"),
    C("lm10", "expressions", "lmeval-minerva", r"\frac{14}{3}", 1,
      r"$f(-2)+f(-1)+f(0)=2+\frac{5}{3}+1=\boxed{\frac{14}{3}}$. Let me double-check: $2 + 1 = 3$ and "
      r"$3 + \frac{5}{3} = \frac{14}{3}$, which matches."),
    C("lm11", "sets", "lighteval-match", "5", 0, r"It is either $\boxed{3}$ or $\boxed{5}$, I cannot tell which."),
    C("lm12", "units", "qwen-parser", "5", 0, "The answer is 5 x."),
    C("lm13", "expressions", "qwen-parser", r"2\pi", 1, "One full turn, so the answer is 2 pi."),
    C("lm14", "thousands", "verl-gsm8k", "1200", 1, "Twelve payments of $100 each.\n#### $1,200"),
    C("lm15", "thousands", "verl-gsm8k", "18", 1, "9 eggs at $2 each.\n#### 18.00"),
    C("lm16", "numbers", "lighteval-match", "-5", 1, "The temperature falls to \u22125 degrees, so the answer is \u22125."),
    C("lm17", "text", "qwen-grader", "No", 1, r"Such a triangle cannot exist, so the answer is $\boxed{\text{No}}$."),
    C("lm18", "text", "prm800k-grader", "no", 1, "The sum is odd, so it cannot be split evenly. The answer is: no."),
    C("lm19", "text", "qwen-parser", "C", 1, "Only option C fits all three conditions. The answer is (C) 12."),
    C("lm20", "sets", "qwen-grader", r"\pm 3", 1, r"Taking square roots, $x=3$ or $x=-3$."),
    C("lm21", "sets", "lighteval-match", "1, 2", 1, r"Factoring gives $\boxed{x = 1, 2}$."),
    C("lm22", "numbers", "simple-evals", "3/2", 1, "Answer: 1.5"),
    C("lm23", "numbers", "simple-evals", "3/2", 0, "Answer: 1.6"),
    C("lm24", "chat_markers", "openrlhf-gen", "6", 1,
      "Let me verify: 2 * 3 = 6.\n**Final Answer**\n\\[\n\\boxed{6}\n\\]<|im_end|>"),
    C("lm25", "no_marker", "lighteval-match", "6", 1, "Let me verify: 2 * 3 = 6.\n**Final Answer**\n6"),
    C("lm26", "equations", "lighteval-match", "y = 2x + 1", 1, r"Therefore the line is $y = 2x + 1$."),
    C("lm27", "equations", "lighteval-match", "y = 2x + 1", 0, r"Therefore the line is $y = 2x - 1$."),
    C("lm28", "percent", "qwen-grader", r"20\%", 1,
      "The price fell from 50 to 40, a drop of 10, which is 10/50 = 0.2 of the original, i.e. 20%."),
    C("lm29", "percent", "qwen-grader", r"20\%", 0,
      "The price fell from 50 to 40, a drop of 10, which is 10/40 = 0.25 of the new price, i.e. 25%."),
    C("lm30", "intervals", "lmeval-minerva", "[2,5)", 1,
      "We need $x - 2 \\ge 0$ and $5 - x > 0$.\nFinal Answer: The final answer is $[2,5)$. I hope it is correct."),
    C("lm31", "matrices", "lighteval-match", r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}", 1,
      "Multiplying out,\n$$\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}$$\nis the matrix we want."),
    C("lm32", "thousands", "lmeval-gsm8k", "2500", 0,
      "Each of the 5 trips costs 500 dollars, 2,500 in all, plus a 50 dollar fee: 2,550 dollars."),
    C("lm33", "units", "simple-evals", "12", 1, r"So the perimeter is $\boxed{12\ \text{cm}}$."),
    C("lm34", "units", "simple-evals", "30", 1, "It takes 30 minutes.\nAnswer: 30 min"),
    C("lm35", "chat_markers", "verl-dapo-eos", "3", 1, "Answer: 3\n<|im_end|>\n<|endoftext|>"),
    C("lm36", "no_marker", "verl-gsm8k", "7", 0, "I could not work out how many marbles are left."),
    C("lm37", "percent", "qwen-grader", "0.5", 0, r"Half of them: $\boxed{50}$."),
    C("lm38", "sets", "lighteval-match", "3, 5", 1, r"The odd primes below 6 are $\boxed{3}, \boxed{5}$."),
    C("lm39", "units", "prm800k-grader", "4", 1, "The square has area 4 meters squared, so the answer is 4 meters squared."),
]:
    _add(case)

# ---------------------------------------------------------------------- units after an expression (issue 33)
# verl's prime_math and OpenRLHF's math_utils drop "cm", "meter", "second", ... after any answer;
# lm-eval's Minerva normaliser (and verl's DAPO copy) removes "cm", "units", "square", "\text{}^2";
# hendrycks / OpenRLHF's _remove_right_units cut at "\text{ "; Qwen2.5-Math removes a final \text{...}
# and listed unit words only where they stand apart ((^|\W)unit($|\W)): "2ab" keeps its letters. A unit
# stripper must never cut inside a command: lm-eval's Minerva list removes "ft" anywhere, and so turns
# "\infty" into "\iny" (lm-evaluation-harness issue #2212, labels it "couldn't parse").
for case in [
    C("ue01", "units", "verl-prime", r"2\pi", 1, r"The circumference of the unit circle is $\boxed{2\pi cm}$."),
    C("ue02", "units", "openrlhf-mathd", r"2\pi", 1, r"The circumference is $\boxed{2\pi\text{ cm}}$."),
    C("ue03", "units", "verl-dapo-norm", r"4\pi", 1, r"The sphere's surface is $\boxed{4\pi \text{ cm}^2}$."),
    C("ue04", "units", "verl-dapo-norm", r"8\pi", 0, r"The sphere's surface is $\boxed{4\pi \text{ cm}^2}$."),
    C("ue05", "units", "lmeval-minerva-norm", r"3\sqrt{2}", 1, r"The diagonal is $\boxed{3\sqrt{2}\ \mathrm{m}}$."),
    C("ue06", "units", "verl-dapo-norm", r"\frac{25}{2}", 1, r"The area is $\boxed{\frac{25}{2} \text{ square units}}$."),
    C("ue07", "units", "qwen-strip", r"2\pi", 0, r"The circumference is $\boxed{2\pi r}$."),
    C("ue08", "units", "verl-prime", "x+1", 1, r"The rope is $\boxed{x + 1 \text{ meters}}$ long."),
    C("ue09", "units", "qwen-strip", "2", 0, r"Expanding, the coefficient is $\boxed{2ab}$."),
    C("ue10", "units", "openrlhf-mathd", "12", 1, r"The side is $\boxed{12\,\text{cm}}$."),
    C("ue11", "units", "verl-prime", r"\frac{1}{2}", 1, r"It takes $\boxed{\frac12\text{ hour}}$."),
    C("ue12", "units", "qwen-strip", "3", 1, r"The speed is $\boxed{3\text{ km/h}}$."),
    C("ue13", "units", "verl-prime", "90", 1, r"The angle is $\boxed{90\text{ degrees}}$."),
    C("ue14", "units", "lmeval-minerva-norm", r"(27, \infty)", 1, r"So $x$ lies in $\boxed{(27,\infty)}$."),
    C("ue15", "units", "verl-prime", r"5\sqrt{3}", 1, "The height is 5\\sqrt{3} cm.\nAnswer: $5\\sqrt{3}$ cm"),
    C("ue16", "units", "verl-prime", r"6\pi", 0, r"The arc is $\boxed{3\pi \text{ cm}}$ long."),
    C("ue17", "units", "qwen-strip", r"\frac{9}{2}", 1, r"The volume is $\boxed{\frac{9}{2}\text{ cm}^3}$.<|im_end|>"),
    C("ue18", "units", "lmeval-minerva-norm", "100", 1, r"The distance is $\boxed{100\mbox{ km}}$."),
]:
    _add(case)

# ---------------------------------------------------------------------- letters (issue 33)
# A letter in a font or style command is the letter: verl's prime_math and OpenRLHF's math_utils render
# LaTeX to text with pylatexenc (\mathcal{B} -> B, \mathbb{R} -> R), Qwen2.5-Math deletes \mathbf and
# turns (-\infty,\infty) into \mathbb{R}, lm-eval's Minerva normaliser unwraps \text{} and \textbf{},
# NeMo-Skills compares "\mathrm{E}" with "E".
for case in [
    C("lt01", "letters", "verl-prime", "B", 1, r"The set with the most elements is $\boxed{\mathcal{B}}$."),
    C("lt02", "letters", "verl-prime", r"\mathcal{B}", 1, r"The set with the most elements is $\boxed{B}$."),
    C("lt03", "letters", "verl-prime", "B", 0, r"The set with the most elements is $\boxed{\mathcal{C}}$."),
    C("lt04", "letters", "qwen-strip", r"\mathbf{A}", 1, r"The matrix is $\boxed{A}$."),
    C("lt05", "letters", "openrlhf-mathd", "F", 1, r"The family is $\boxed{\mathscr{F}}$."),
    C("lt06", "letters", "openrlhf-mathd", "g", 1, r"The Lie algebra is $\boxed{\mathfrak{g}}$."),
    C("lt07", "letters", "verl-prime", r"\mathbb{R}", 1, r"The domain is $\boxed{R}$."),
    C("lt08", "letters", "qwen-strip", r"(-\infty, \infty)", 1, r"The domain is $\boxed{\mathbb{R}}$."),
    C("lt09", "letters", "openrlhf-mathd", "P", 1, r"The answer is $\boxed{\mathcal P}$."),
    C("lt10", "letters", "nemo-equal", "E", 1, r"$\boxed{\mathit{E}}$"),
    C("lt11", "letters", "verl-prime", r"\mathcal{B}", 0, r"$\boxed{\mathcal{D}}$"),
    C("lt12", "letters", "openrlhf-mathd", r"\mathcal{L}(V)", 1, r"The space of operators is $\boxed{L(V)}$."),
    C("lt13", "letters", "qwen-strip", "D", 1, r"So the point is $\boxed{\boldsymbol{D}}$."),
    C("lt14", "letters", "lmeval-minerva-norm", r"\textbf{C}", 1, "The answer is C."),
    C("lt15", "letters", "verl-prime", "M", 0, r"The midpoint is $\boxed{\mathsf{N}}$."),
    C("lt16", "letters", "verl-prime", r"\mathbb{Z}", 1, r"The kernel is $\boxed{\mathbb Z}$."),
    C("lt17", "letters", "verl-prime", "Z", 0, r"The kernel is $\boxed{\mathbb{Q}}$."),
]:
    _add(case)

# ---------------------------------------------------------------------- radicals (issue 33)
# TeX reads one token after \sqrt or \sqrt[n] when no brace follows: lm-eval's Minerva normaliser
# ("\sqrta -> \sqrt{a}", "\sqrtab -> sqrt{a}b"), hendrycks' / OpenRLHF's _fix_sqrt; Qwen2.5-Math's
# _fix_sqrt takes the whole word (\sqrt23 -> \sqrt{23}). Sympy-based graders (verl's prime_math grader,
# Qwen2.5-Math, DeepSeek-Math) compare radicals by value.
for case in [
    C("rd01", "radicals", "lmeval-minerva-norm", r"\sqrt[3]{2}", 1, r"The edge of the doubled cube is $\boxed{\sqrt[3]2}$."),
    C("rd02", "radicals", "lmeval-minerva-norm", r"\sqrt[3]2", 1, r"The edge of the doubled cube is $\boxed{\sqrt[3]{2}}$."),
    C("rd03", "radicals", "lmeval-minerva-norm", r"\sqrt[3]{2}", 0, r"The edge is $\boxed{\sqrt[3]{3}}$."),
    C("rd04", "radicals", "openrlhf-mathd", r"\sqrt{2}", 1, r"The diagonal is $\boxed{\sqrt2}$."),
    C("rd05", "radicals", "openrlhf-mathd", r"\sqrt2", 1, r"The diagonal is $\boxed{\sqrt{2}}$."),
    C("rd06", "radicals", "verl-prime-grader", r"2\sqrt[3]{2}", 1, r"$\boxed{\sqrt[3]{16}}$"),
    C("rd07", "radicals", "verl-prime-grader", r"\sqrt[4]{3}", 1, r"$\boxed{3^{1/4}}$"),
    C("rd08", "radicals", "lmeval-minerva-norm", r"\sqrt{3}", 1, r"$\boxed{\sqrt 3}$"),
    C("rd09", "radicals", "lmeval-minerva-norm", r"\sqrt[3]{2}", 1, r"$\boxed{\sqrt[3] 2}$"),
    C("rd10", "radicals", "openrlhf-mathd", r"3\sqrt{2}", 1, r"$\boxed{3\sqrt2}$"),
    C("rd11", "radicals", "lmeval-minerva-norm", r"\sqrt{23}", 0, r"$\boxed{\sqrt23}$",
      contested="TeX and the Minerva / hendrycks normalisers read one digit (\\sqrt{2}3); Qwen2.5-Math reads \\sqrt{23}"),
    C("rd12", "radicals", "verl-prime-grader", r"\sqrt[3]{x}", 1, r"$\boxed{x^{1/3}}$"),
    C("rd13", "radicals", "lmeval-minerva-norm", r"1+\sqrt[3]{2}", 1, r"$\boxed{1+\sqrt[3]2}$"),
    C("rd14", "radicals", "lmeval-minerva-norm", r"\sqrt[3]{4}", 0, r"$\boxed{\sqrt4}$"),
    C("rd15", "radicals", "verl-prime-grader", r"\frac{\sqrt[3]{2}}{2}", 1, r"$\boxed{\frac{1}{\sqrt[3]{4}}}$"),
    C("rd16", "radicals", "lmeval-minerva-norm", r"\sqrt[3]{2\pi}", 1, r"$\boxed{\sqrt[3]{2\pi}}$"),
    C("rd17", "radicals", "lmeval-minerva-norm", r"\sqrt[3]\pi", 1, r"$\boxed{\sqrt[3]{\pi}}$"),
]:
    _add(case)

# ---------------------------------------------------------------------- labels (issue 33)
# Dataset labels carry stray characters: DeepSeek-Math's parse_digits drops a backslash left at the end
# of a number ("12\%" -> "12\"), Qwen2.5-Math drops a final "/" or "." from an answer, hendrycks / lm-eval
# strip "$" around a label, the Minerva normaliser keeps what follows the last "=".
for case in [
    C("lb01", "labels", "deepseek-digits", "185\\", 1, r"So the total is $\boxed{185}$."),
    C("lb02", "labels", "deepseek-digits", "185\\", 0, r"So the total is $\boxed{186}$."),
    C("lb03", "labels", "deepseek-digits", "\\frac{1}{2}\\", 1, r"$\boxed{0.5}$"),
    C("lb04", "labels", "qwen-strip", "x^2+1\\", 1, r"$\boxed{x^2+1}$"),
    C("lb05", "labels", "deepseek-digits", "185\\\\", 1, r"So the total is $\boxed{185}$."),
    C("lb06", "labels", "qwen-strip", "42", 1, "Six times seven.\nAnswer: 42\\"),
    C("lb07", "labels", "lmeval-minerva-norm", r"$\frac{3}{4}$", 1, r"$\boxed{3/4}$"),
    C("lb08", "labels", "lmeval-minerva-norm", "x = 7", 1, r"$\boxed{7}$"),
    C("lb09", "labels", "deepseek-digits", r"12\%\\", 1, r"$\boxed{12\%}$"),
    C("lb10", "labels", "qwen-strip", "24/", 1, r"$\boxed{24}$"),
    C("lb11", "labels", "qwen-strip", "24.", 1, r"$\boxed{24}$"),
    C("lb12", "labels", "deepseek-digits", "185\\", 0, r"So the total is $\boxed{18}$.<|im_end|>"),
]:
    _add(case)

del case
