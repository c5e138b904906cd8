"""A corpus of bad inputs, every subcommand and the web API: each gets one line naming the
problem (exit status 2 on the CLI, a 4xx JSON ``{"error": ...}`` on the web), never a
traceback, and nothing is written.

Each CLI case runs in-process in an empty output directory (``{tmp}``) with broken input files
from :mod:`bad_inputs` (``{badtrace}``, ``{badtoml}``, ...); its expected text is a fragment of
the one line.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
from bad_inputs import make_fixtures

from kvcargo.cli import main

CLI_CASES = [
    ('handoff --model nope', "unknown model 'nope'; valid choices:"),
    ('handoff --prompt 0', 'prompt must be a positive whole number of tokens, got 0'),
    ('handoff --prompt -1', 'prompt must be a positive whole number of tokens, got -1'),
    ('handoff --prompt 1.5', "Invalid value for '--prompt': '1.5' is not a valid integer."),
    ('handoff --prompt abc', "Invalid value for '--prompt': 'abc' is not a valid integer."),
    ('handoff --prompt 6000000', '--prompt of 6,000,000 tokens is above 5,903,082, the most on'),
    ('handoff --prompt 1000000000000', '--prompt of 1,000,000,000,000 tokens is above 5,903,082, the'),
    ('handoff --prompt 99999999999999999999999', '--prompt of 99,999,999,999,999,999,999,999 tokens is above 5'),
    ('handoff --link nope', "unknown link 'nope'; valid choices:"),
    ('handoff --kv-compress nope', "unknown codec 'nope'; valid choices:"),
    ('handoff --kv-keep 0.5', '--kv-keep needs a codec: add --kv-compress freq-keep-k'),
    ('handoff --kv-ratio 3', '--kv-ratio needs a codec: add --kv-compress ratio'),
    ('handoff --kv-compress fp8 --kv-ratio 3', "--kv-ratio applies only to a 'ratio' codec, not 'fp8'"),
    ('handoff --kv-compress fp8 --kv-keep 0.5', "--kv-keep applies only to freq-keep-k, not 'fp8'"),
    ('handoff --kv-compress freq-keep-k --kv-keep 0', '--kv-keep 0 is out of range: 0.001 to 1 (keeping under 1 in'),
    ('handoff --kv-compress freq-keep-k --kv-keep 1.5', '--kv-keep 1.5 is out of range: 0.001 to 1 (keeping under 1 i'),
    ('handoff --kv-compress freq-keep-k --kv-keep nan', '--kv-keep nan is out of range: 0.001 to 1 (keeping under 1 i'),
    ('handoff --kv-compress freq-keep-k --kv-keep 1e-9', '--kv-keep 1e-09 is out of range: 0.001 to 1 (keeping under 1'),
    ('handoff --kv-compress ratio --kv-ratio 0.5', '--kv-ratio 0.5 is out of range: 1 to 1,000 (ten times beyond'),
    ('handoff --kv-compress ratio --kv-ratio inf', '--kv-ratio inf is out of range: 1 to 1,000 (ten times beyond'),
    ('handoff --kv-compress ratio --kv-ratio nan', '--kv-ratio nan is out of range: 1 to 1,000 (ten times beyond'),
    ('handoff --kv-compress ratio --kv-ratio 1e9', '--kv-ratio 1e+09 is out of range: 1 to 1,000 (ten times beyo'),
    ('handoff --send sideways', "Invalid value for '--send': 'sideways' is not one of 'whole'"),
    ('handoff --device nope', "unknown device 'nope'; valid choices:"),
    ('handoff --devices-per-instance 0', '--devices-per-instance 0 is out of range: 1 to 1,024 (beyond'),
    ('handoff --devices-per-instance -3', '--devices-per-instance -3 is out of range: 1 to 1,024 (beyon'),
    ('handoff --devices-per-instance 5000', '--devices-per-instance 5000 is out of range: 1 to 1,024 (bey'),
    ('handoff --model llama3-70b --device a100-40g', 'Llama-3-70B does not fit the prefill pool (1x a100-40g, 40 G'),
    ('handoff --links --link eth-25g', '--links shows every link: drop --link (or drop --links for o'),
    ('handoff --catalog /nonexistent.toml', 'catalog file /nonexistent.toml: cannot read (No such file or'),
    ('handoff --bogus', "No such option '--bogus'."),
    ('handoff extra-arg', 'Got unexpected extra argument (extra-arg)'),
    ('catalog nope', "Invalid value for '[models|devices|links|codecs|traces]': 'n"),
    ('catalog --catalog /nonexistent.toml', 'catalog file /nonexistent.toml: cannot read (No such file or'),
    ('catalog models --bogus', "No such option '--bogus'."),
    ('catalog --catalog {badmodel}', "entry models.bad: field '(entry)': Value error, kv_heads (3)"),
    ('catalog --catalog {badtoml}', "not valid TOML (Expected ']' at the end of a table declarati"),
    ('catalog --catalog {unknownkind}', "unknown section 'gizmos'; valid sections:"),
    ('catalog --catalog {badfield}', "entry links.x: field 'bandwidth': Input should be greater th"),
    ('simulate --model nope', "unknown model 'nope'; valid choices:"),
    ('simulate --device nope', "unknown device 'nope'; valid choices:"),
    ('simulate --prefill-device nope', "unknown device 'nope'; valid choices:"),
    ('simulate --decode-device nope', "unknown device 'nope'; valid choices:"),
    ('simulate --link nope', "unknown link 'nope'; valid choices:"),
    ('simulate --kv-compress nope', "unknown codec 'nope'; valid choices:"),
    ('simulate --mode both', "Invalid value for '--mode': 'both' is not one of 'disagg', '"),
    ('simulate --kv-compress-at cloud', "Invalid value for '--kv-compress-at': 'cloud' is not one of"),
    ('simulate --send sideways', "Invalid value for '--send': 'sideways' is not one of 'whole'"),
    ('simulate --topology ring', "Invalid value for '--topology': 'ring' is not one of 'shared"),
    ('simulate --link-sharing random', "Invalid value for '--link-sharing': 'random' is not one of '"),
    ('simulate --kv-reserve never', "Invalid value for '--kv-reserve': 'never' is not one of 'at-"),
    ('simulate --lm-head middle', "Invalid value for '--lm-head': 'middle' is not one of 'all',"),
    ('simulate --time-unit days --workload-file azure-code-2023', "Invalid value for '--time-unit': 'days' is not one of 's', '"),
    ('simulate --devices-per-instance 0', 'invalid --devices-per-instance (got 0): Input should be grea'),
    ('simulate --devices-per-instance 2000', '--devices-per-instance 2000 is out of range: 1 to 1,024 (bey'),
    ('simulate --prefill-devices-per-instance 0', 'invalid --prefill-devices-per-instance (got 0): Input should'),
    ('simulate --decode-devices-per-instance 99999', '--decode-devices-per-instance 99999 is out of range: 1 to 1,'),
    ('simulate --prefill 0', 'invalid --prefill (got 0): Input should be greater than or e'),
    ('simulate --prefill 10001', '--prefill 10001 is out of range: 1 to 10,000 (a typo must no'),
    ('simulate --decode -1', 'invalid --decode (got -1): Input should be greater than or e'),
    ('simulate --decode 1e3', "Invalid value for '--decode': '1e3' is not a valid integer."),
    ('simulate --instances 0 --mode colocated', 'invalid --instances (got 0): Input should be greater than or'),
    ('simulate --instances 30000 --mode colocated', '--instances 30000 is out of range: 1 to 20,000 (a typo must'),
    ('simulate --link-channels 0', 'invalid --link-channels (got 0): Input should be greater tha'),
    ('simulate --link-channels 100000', '--link-channels 100000 is out of range: 1 to 10,000 (a typo'),
    ('simulate --rate 0', 'invalid --rate (got 0.0): Input should be greater than 0'),
    ('simulate --rate -1', 'invalid --rate (got -1.0): Input should be greater than 0'),
    ('simulate --rate nan', 'invalid --rate (got nan): Input should be a finite number'),
    ('simulate --rate inf', 'invalid --rate (got inf): Input should be a finite number'),
    ('simulate --rate 1e-300', '--rate 1e-300 is out of range: 1e-06 to 1,000,000 (slower, t'),
    ('simulate --rate 1e300', '--rate 1e+300 is out of range: 1e-06 to 1,000,000 (slower, t'),
    ('simulate --rate 1e-7', '--rate 1e-07 is out of range: 1e-06 to 1,000,000 (slower, th'),
    ('simulate --rate 2e6', '--rate 2e+06 is out of range: 1e-06 to 1,000,000 (slower, th'),
    ('simulate --rate abc', "Invalid value for '--rate': 'abc' is not a valid float."),
    ('simulate --requests 0', 'invalid --requests (got 0): Input should be greater than or'),
    ('simulate --requests -5', 'invalid --requests (got -5): Input should be greater than or'),
    ('simulate --requests 60000000', 'invalid --requests (got 60000000): Input should be less than'),
    ('simulate --requests 1.5', "Invalid value for '--requests': '1.5' is not a valid integer"),
    ('simulate --requests 50000000 --rate 1e-6 --prompt 4 --output 4', 'the last request arrives at 5e+13 s, beyond 1e+09 s (about 3'),
    ('simulate --prompt 0', 'invalid --prompt (got 0.0): Input should be greater than 0'),
    ('simulate --prompt -2', 'invalid --prompt (got -2.0): Input should be greater than 0'),
    ('simulate --prompt nan', 'invalid --prompt (got nan): Input should be a finite number'),
    ('simulate --prompt inf', 'invalid --prompt (got inf): Input should be a finite number'),
    ('simulate --output 0', 'invalid --output (got 0.0): Input should be greater than 0'),
    ('simulate --output inf', 'invalid --output (got inf): Input should be a finite number'),
    ('simulate --prompt-cv -1', 'invalid --prompt-cv (got -1.0): Input should be greater than'),
    ('simulate --prompt-cv 1e200', '--prompt-cv 1e+200 is out of range: 0 to 100 (beyond it almo'),
    ('simulate --prompt-cv nan', 'invalid --prompt-cv (got nan): Input should be a finite numb'),
    ('simulate --output-cv -0.1', 'invalid --output-cv (got -0.1): Input should be greater than'),
    ('simulate --output-cv 101', '--output-cv 101 is out of range: 0 to 100 (beyond it almost'),
    ('simulate --seed x', "Invalid value for '--seed': 'x' is not a valid integer."),
    ('simulate --seed 1.5', "Invalid value for '--seed': '1.5' is not a valid integer."),
    ('simulate --ttft-slo 0', 'invalid --ttft-slo (got 0.0): Input should be greater than 0'),
    ('simulate --ttft-slo -1', 'invalid --ttft-slo (got -1.0): Input should be greater than'),
    ('simulate --ttft-slo inf', 'invalid --ttft-slo (got inf): Input should be a finite numbe'),
    ('simulate --ttft-slo 1e10', '--ttft-slo 1e+10 is out of range: at most 1,000,000,000 (the'),
    ('simulate --tpot-slo 0', 'invalid --tpot-slo (got 0.0): Input should be greater than 0'),
    ('simulate --tpot-slo nan', 'invalid --tpot-slo (got nan): Input should be a finite numbe'),
    ('simulate --kv-keep 0.5', '--kv-keep applies only to --kv-compress freq-keep-k'),
    ('simulate --kv-compress freq-keep-k --kv-keep 0', 'invalid --kv-keep (got 0.0): Input should be greater than 0'),
    ('simulate --kv-compress freq-keep-k --kv-keep 2', 'invalid --kv-keep (got 2.0): Input should be less than or eq'),
    ('simulate --kv-compress freq-keep-k --kv-keep 1e-6', '--kv-keep 1e-06 is out of range: 0.001 to 1 (keeping under 1'),
    ('simulate --kv-ratio 3', '--kv-ratio needs the ratio codec: add --kv-compress ratio'),
    ('simulate --kv-compress ratio --kv-ratio 0.9', 'invalid --kv-ratio (got 0.9): Input should be greater than o'),
    ('simulate --kv-compress ratio --kv-ratio 1e5', '--kv-ratio 100000 is out of range: 1 to 1,000 (ten times bey'),
    ('simulate --kv-compress fp8 --kv-ratio 3', "--kv-ratio applies only to a 'ratio' codec, not 'fp8'"),
    ('simulate --power-cap 0', 'invalid --power-cap (got 0.0): Input should be greater than'),
    ('simulate --power-cap -5', 'invalid --power-cap (got -5.0): Input should be greater than'),
    ('simulate --power-cap 10', 'power cap 10 W is not above the static power of h100 (100 W'),
    ('simulate --power-cap 1e9', '--power-cap 1e+09 is out of range: at most 100,000 (far abov'),
    ('simulate --prefill-power-cap nan', 'invalid --prefill-power-cap (got nan): Input should be a fin'),
    ('simulate --decode-power-cap 1', 'power cap 1 W is not above the static power of h100 (100 W p'),
    ('simulate --mode colocated --kv-compress fp8', 'KV compression needs a hand-off: use --mode disagg or drop -'),
    ('simulate --mode colocated --send layerwise', '--send, --topology, --link-sharing, --kv-reserve and --decod'),
    ('simulate --mode colocated --topology nic', '--send, --topology, --link-sharing, --kv-reserve and --decod'),
    ('simulate --mode colocated --decode-prefix-cache', '--send, --topology, --link-sharing, --kv-reserve and --decod'),
    ('simulate --layer-groups 4', '--layer-groups applies only to --send layerwise'),
    ('simulate --send layerwise --layer-groups 0', 'invalid --layer-groups (got 0): Input should be greater than'),
    ('simulate --send layerwise --layer-groups 9999', '--layer-groups 9999 is out of range: 1 to 4,096 (more slices'),
    ('simulate --nics-per-instance 4', '--nics-per-instance applies only to --topology nic'),
    ('simulate --topology nic --nics-per-instance 0', 'invalid --nics-per-instance (got 0): Input should be greater'),
    ('simulate --topology nic --nics-per-instance 100', '--nics-per-instance 100 is out of range: 1 to 64 (a typo mus'),
    ('simulate --domain-size 4', '--domain-size applies only to --topology nvlink-domain'),
    ('simulate --topology nvlink-domain --domain-size 0', 'invalid --domain-size (got 0): Input should be greater than'),
    ('simulate --token-budget 0', 'invalid --token-budget (got 0): Input should be greater than'),
    ('simulate --token-budget 100000000', '--token-budget 1e+08 is out of range: 1 to 16,777,216 (one p'),
    ('simulate --token-budget 10000000', '--token-budget of 10,000,000 tokens is above 5,903,082, the'),
    ('simulate --max-batch 0', 'invalid --max-batch (got 0): Input should be greater than or'),
    ('simulate --max-batch 2000000', '--max-batch 2e+06 is out of range: 1 to 1,000,000 (a typo mu'),
    ('simulate --max-length 0', "--max-length 0 is out of range: 1 to 16,777,216 (one prompt'"),
    ('simulate --max-length 100000000', '--max-length 1e+08 is out of range: 1 to 16,777,216 (one pro'),
    ('simulate --max-length 65536 --workload-file azure-code-2023', '--max-length applies only to generated workloads, not to a t'),
    ('simulate --decode-prefix-cache', '--decode-prefix-cache needs prompt block ids: replay a trace'),
    ('simulate --model llama3-70b', 'Llama-3-70B does not fit the prefill pool (1x h100, 80 GB):'),
    ('simulate --model llama3-70b --devices-per-instance 1 --device a100-40g', 'Llama-3-70B does not fit the prefill pool (1x a100-40g, 40 G'),
    ('simulate --time-scale 2', '--time-scale applies only to a trace (--workload-file)'),
    ('simulate --limit 10', '--limit applies only to a trace (--workload-file)'),
    ('simulate --window 0:10', '--window applies only to a trace (--workload-file)'),
    ('simulate --arrival-col t', '--arrival-col applies only to a trace (--workload-file)'),
    ('simulate --workload-file nope.csv', 'trace file nope.csv: cannot read (No such file or directory)'),
    ('simulate --workload-file {badtrace}', "line 1: unrecognised trace header 'foo,bar'; expected arriva"),
    ('simulate --workload-file {emptytrace}', 'empty file (no requests)'),
    ('simulate --workload-file {hugeprompt}', "request 0's prompt of 100,000,000,000 tokens is above 5,903,"),
    ('simulate --workload-file {negarrival}', "line 2: arrival must be >= 0 seconds, got '-1'"),
    ('simulate --workload-file {zerolen}', 'line 2: prompt length must be a whole number of tokens >= 1,'),
    ('simulate --workload-file {farfuture}', 'the last request arrives at 1e+12 s, beyond 1e+09 s (about 3'),
    ('simulate --workload-file {binary}', 'line 2: not UTF-8 text'),
    ('simulate --workload-file azure-code-2023 --rate 2 --time-scale 2', '--time-scale and --rate both set the replay speed: give one'),
    ('simulate --workload-file azure-code-2023 --time-scale 0', 'invalid --time-scale (got 0.0): Input should be greater than'),
    ('simulate --workload-file azure-code-2023 --time-scale 1e9', '--time-scale 1e+09 is out of range: 1e-06 to 1,000,000 (as f'),
    ('simulate --workload-file azure-code-2023 --limit 0', 'invalid --limit (got 0): Input should be greater than or equ'),
    ('simulate --workload-file azure-code-2023 --window abc', "invalid --window 'abc': expected START:END in seconds (e.g."),
    ('simulate --workload-file azure-code-2023 --window 10:5', "invalid --window '10:5': need 0 <= START < END"),
    ('simulate --workload-file azure-code-2023 --window 1e9:', 'window 1e+09: s holds no requests (the trace spans 0–3435.95'),
    ('simulate --workload-file azure-code-2023 --requests 10', '--requests applies only to generated workloads, not to a tra'),
    ('simulate --workload-file azure-code-2023 --prompt 100', '--prompt applies only to generated workloads, not to a trace'),
    ('simulate --workload-file azure-code-2023 --seed 3', '--seed applies only to generated workloads, not to a trace ('),
    ('simulate --workload-file azure-code-2023 --arrival-col nope', "line 2: no arrival column 'nope'; name the columns with --ar"),
    ('simulate --workload-file {dirpath}', 'cannot read (Is a directory)'),
    ('simulate --catalog /nonexistent.toml', 'catalog file /nonexistent.toml: cannot read (No such file or'),
    ('simulate --catalog {badtoml}', "not valid TOML (Expected ']' at the end of a table declarati"),
    ('simulate --bogus 1', "No such option '--bogus'."),
    ('simulate --requests-csv /nonexistent/dir/r.csv', "--requests-csv '/nonexistent/dir/r.csv': directory '/nonexis"),
    ('simulate --requests-csv {tmp}/r.txt', 'use a file ending in .csv'),
    ('simulate --requests-csv {tmp}', "Invalid value for '--requests-csv': File"),
    ('simulate --trace /nonexistent/t.json', "--trace '/nonexistent/t.json': directory '/nonexistent' does"),
    ('simulate --trace {tmp}/t.csv', 'use a file ending in .json'),
    ('simulate --summary-only --requests-csv {tmp}/r.csv', '--summary-only keeps no per-request records: drop --requests'),
    ('simulate --requests-csv /proc/r.csv', "--requests-csv '/proc/r.csv': cannot write in '/proc' (No su"),
    ('sweep', 'empty grid: nothing to sweep (give --vary NAME=V1,V2,... or'),
    ('sweep --vary rate', "bad --vary 'rate': use NAME=V1,V2,... (for example rate=8,10"),
    ('sweep --vary rate=', "--vary rate has an empty value (got ''): list at least one"),
    ('sweep --vary nope=1,2', "unknown parameter 'nope' in --vary; valid:"),
    ('sweep --vary rate=a,b', "invalid value 'a' for rate (--vary): Input should be a valid"),
    ('sweep --vary rate=8,8', 'rate lists 8.0 twice'),
    ('sweep --vary rate=1:0:1', "bad range '1:0:1': needs START <= STOP and STEP > 0"),
    ('sweep --vary rate=0:10:0', "bad range '0:10:0': needs START <= STOP and STEP > 0"),
    ('sweep --vary rate=8,9 --rate 5', '--rate is both fixed and varied; drop one'),
    ('sweep --vary link=nope,eth-25g --out {tmp}/s.csv', "unknown link 'nope'; valid choices:"),
    ('sweep --vary model=llama3-8b,nope', "unknown model 'nope'; valid choices:"),
    ('sweep --vary kv-compress=fp8,zip', "unknown codec 'zip'; valid choices:"),
    ('sweep --vary rate=8,9 --out /nonexistent/s.csv', "--out '/nonexistent/s.csv': directory '/nonexistent' does no"),
    ('sweep --vary rate=8,9 --out {tmp}', "Invalid value for '--out' / '-o': File"),
    ('sweep --vary rate=8,9 --out {tmp}/s.txt', 'use a file ending in .csv, .parquet'),
    ('sweep --vary rate=8,9 --out {tmp}/results', 'use a file ending in .csv, .parquet'),
    ('sweep --vary rate=8,9 --plot {tmp}/p.jpg', 'use a file ending in .png, .svg, .pdf, .html'),
    ('sweep --vary rate=8,9 --plot /nonexistent/p.png', "--plot '/nonexistent/p.png': directory '/nonexistent' does n"),
    ('sweep --vary rate=8,9 --workers 0', '--workers must be >= 1, got 0'),
    ('sweep --vary rate=8,9 --backend nope', "Invalid value for '--backend': 'nope' is not one of 'local',"),
    ('sweep --vary rate=8,9 --address 1.2.3.4:1', '--address needs --backend ray or --backend dask'),
    ('sweep --vary rate=8,9 --x nope --plot {tmp}/p.png', "unknown parameter 'nope' in --x; valid:"),
    ('sweep nope.toml', "sweep file 'nope.toml' not found"),
    ('sweep {badtoml}', "Expected ']' at the end of a table declaration (at line 1, c"),
    ('sweep --vary rate=8,9 --requests 0', 'invalid value 0 for requests (options): Input should be grea'),
    ('sweep --vary rate=8,9 --fresh --retry-failed', '--fresh acts on the rows of --out: give --out FILE.csv'),
    ('sweep --vary rate=1e300,2', '--rate 1e+300 is out of range: 1e-06 to 1,000,000 (slower, t'),
    ('sweep --vary requests=0,1', "invalid value '0' for requests (--vary): Input should be gre"),
    ('sweep --vary mode=disagg,sideways', "invalid value 'sideways' for mode (--vary): Input should be"),
    ('capacity --rate 5', 'capacity searches the arrival rate: drop --rate'),
    ('capacity --target 0', '--target must be in (0, 1], got 0'),
    ('capacity --target 1.5', '--target must be in (0, 1], got 1.5'),
    ('capacity --target nan', '--target must be in (0, 1], got nan'),
    ('capacity --rtol 0', '--rtol must be in (0, 1), got 0'),
    ('capacity --rtol -1', '--rtol must be in (0, 1), got -1'),
    ('capacity --rtol 2', '--rtol must be in (0, 1), got 2'),
    ('capacity --plot {tmp}/c.jpg', 'use a file ending in .png, .svg, .pdf, .html'),
    ('capacity --plot /nonexistent/c.png', "--plot '/nonexistent/c.png': directory '/nonexistent' does n"),
    ('capacity --model nope', "unknown model 'nope'; valid choices:"),
    ('capacity --prompt 0', 'invalid --prompt (got 0.0): Input should be greater than 0'),
    ('capacity --requests 0', 'invalid --requests (got 0): Input should be greater than or'),
    ('plan', 'plan needs a budget: --gpus N, --usd DOLLARS or --power-w WA'),
    ('plan --gpus 0', 'impossible budget: --gpus must be a positive number, got 0'),
    ('plan --gpus -4', 'impossible budget: --gpus must be a positive number, got -4'),
    ('plan --usd -1', 'impossible budget: --usd must be a positive number, got -1.0'),
    ('plan --usd nan', 'impossible budget: --usd must be a positive number, got nan'),
    ('plan --power-w 0', 'impossible budget: --power-w must be a positive number, got'),
    ('plan --gpus 4 --cost nope', "Invalid value for '--cost': 'nope' is not one of 'gpus', 'us"),
    ('plan --gpus 4 --devices nope', "unknown device 'nope'; valid choices:"),
    ('plan --gpus 4 --tp 0', '--tp values must be >= 1, got (0,)'),
    ('plan --gpus 4 --tp x', "--tp: expected a comma-separated list of ints, got 'x'"),
    ('plan --gpus 4 --links nope', "unknown link 'nope'; valid choices:"),
    ('plan --gpus 4 --max-instances 0', '--max-instances must be >= 1, got 0'),
    ('plan --gpus 4 --target 0', '--target must be in (0, 1], got 0'),
    ('plan --gpus 4 --target 2', '--target must be in (0, 1], got 2'),
    ('plan --gpus 4 --rtol 0', '--rtol must be in (0, 1), got 0'),
    ('plan --gpus 4 --plot {tmp}/p.jpg', 'use a file ending in .png, .svg, .pdf, .html'),
    ('plan --gpus 4 --plot /nonexistent/p.png', "--plot '/nonexistent/p.png': directory '/nonexistent' does n"),
    ('plan --gpus 4 --rate 0', '--rate 0 is out of range: 1e-06 to 1,000,000 (slower, the cl'),
    ('plan --gpus 4 --rate 1e300', '--rate 1e+300 is out of range: 1e-06 to 1,000,000 (slower, t'),
    ('plan --gpus 4 --model nope', "unknown model 'nope'; valid choices:"),
    ('plan --gpus 4 --workers 0', '--workers must be >= 1, got 0'),
    ('plan --gpus 4 --backend nope', "Invalid value for '--backend': 'nope' is not one of 'local',"),
    ('ui --port 70000', "Invalid value for '--port': 70000 is not in the range 0<=x<="),
    ('ui --port -1', "Invalid value for '--port': -1 is not in the range 0<=x<=655"),
    ('ui --max-requests 0', "Invalid value for '--max-requests': 0 is not in the range 1<"),
    ('ui --timeout 0', "Invalid value for '--timeout': 0.0 is not in the range 0.1<="),
    ('ui --workers 0', "Invalid value for '--workers': 0 is not in the range 1<=x<=6"),
    ('ui --catalog /nonexistent.toml', "Invalid value for '--catalog': File '/nonexistent.toml' does"),
    ('trace-stats', "Missing argument 'FILE'."),
    ('trace-stats nope.csv', 'trace file nope.csv: cannot read (No such file or directory)'),
    ('trace-stats {badtrace}', "line 1: unrecognised trace header 'foo,bar'; expected arriva"),
    ('trace-stats azure-code-2023 --bucket 0', '--bucket must be a positive number of seconds, got 0.0'),
    ('trace-stats azure-code-2023 --bucket -1', '--bucket must be a positive number of seconds, got -1.0'),
    ('trace-stats azure-code-2023 --bucket nan', '--bucket must be a positive number of seconds, got nan'),
    ('trace-stats azure-code-2023 --bucket 1e-9', "--bucket 1e-09 cuts the trace's 3435.95 s into more than 1,0"),
    ('trace-stats azure-code-2023 --model nope', "unknown model 'nope'; valid choices:"),
    ('trace-stats azure-code-2023 --limit 0', 'invalid --limit (got 0): Input should be greater than or equ'),
    ('trace-stats azure-code-2023 --window x', "invalid --window 'x': expected START:END in seconds (e.g. 60"),
    ('trace-stats azure-code-2023 --time-scale -1', 'invalid --time-scale (got -1.0): Input should be greater tha'),
    ('trace-stats azure-code-2023 --rate 0', 'invalid --rate (got 0.0): Input should be greater than 0'),
    ('trace-stats {emptytrace}', 'empty file (no requests)'),
    ('trace-stats {dirpath}', "Invalid value for 'FILE': File"),
    ('step', "Missing option '--phase'. Choose from: prefill, decode"),
    ('step --phase sideways', "Invalid value for '--phase'"),
    ('step --phase prefill', '--phase prefill needs --prompt'),
    ('step --phase decode', '--phase decode needs --context'),
    ('step --phase prefill --prompt 0', '--prompt must be a whole number >= 1, got 0'),
    ('step --phase prefill --prompt 6000000', '--batch × --prompt (1 × 6,000,000) of 6,000,000 tokens is above 5,903,082'),
    ('step --phase prefill --prompt 1000000000000', 'tokens is above 5,903,082, the most one prefill step of llama3-8b'),
    ('step --phase prefill --prompt 100 --batch 100000000', '--batch × --prompt (100,000,000 × 100)'),
    ('step --phase prefill --prompt 100 --batch 0', '--batch must be a whole number >= 1, got 0'),
    ('step --phase decode --context -1', '--context must be a whole number >= 1, got -1'),
    ('step --phase decode --context 100000000000000', 'its FLOP count would overflow a 64-bit integer'),
    ('step --phase decode --context 10 --batch 1000000000000', 'a decode step of --batch 1,000,000,000,000 × --context 10'),
    ('step --phase prefill --prompt 10 --context 5', '--context applies to --phase decode'),
    ('step --phase decode --context 10 --prompt 5', '--prompt applies to --phase prefill'),
    ('step --phase prefill --prompt 10 --model nope', "unknown model 'nope'; valid choices:"),
    ('step --phase prefill --prompt 10 --devices-per-instance 5000', '--devices-per-instance 5000 is out of range'),
    ('step --phase prefill --prompt 10 --cost-model nope', "Invalid value for '--cost-model'"),
    ('step --phase prefill --prompt abc', "Invalid value for '--prompt'"),
    ('calibrate', 'give --steps CSV (step times)'),
    ('calibrate --steps /nonexistent.csv', '/nonexistent.csv: cannot read (No such file or directory)'),
    ('calibrate --steps {badtrace}', 'missing columns model, device, tp, phase, batch, tokens, time_s'),
    ('calibrate --send-recv /nonexistent.csv', '--send-recv and --link go together'),
    ('calibrate --import-aiconfigurator nope', '--import-aiconfigurator, --device and --tables go together'),
    ('validate --group nope', "unknown group 'nope'; valid choices:"),
    ('validate --trace-dir /nonexistent', '--trace-dir /nonexistent: not a directory'),
    ('reproduce --group nope', "unknown group 'nope'; valid choices:"),
    ('reproduce --bogus', "No such option '--bogus'."),
    ('nosuch', "No such command 'nosuch'."),
    ('--bogus', "No such option '--bogus'."),
    ('sweep --vary rate=8,9 --retry-failed', '--retry-failed acts on the rows of --out: give --out FILE.cs'),
    ('sweep --vary rate=nan,2', "invalid value 'nan' for rate (--vary): Input should be a fin"),
    ('sweep --vary prompt=0,2', "invalid value '0' for prompt (--vary): Input should be great"),
    ('plan --gpus 4 --rate nan', '--rate nan is out of range: 1e-06 to 1,000,000 (slower, the'),
    ('simulate --workload-file {hugeprompt} --model llama3-70b --devices-per-instance 2', "request 0's prompt of 100,000,000,000 tokens is above 2,600,"),
    ('handoff --model deepseek-v3 --prompt 4000000 --devices-per-instance 16', '--prompt of 4,000,000 tokens is above 3,206,014, the most on'),
    ('simulate --model mistral-7b-swa --token-budget 6000000', '--token-budget of 6,000,000 tokens is above 5,904,579, the m'),
    ('handoff --catalog {binary}', 'catalog file {dir}/in/bin.csv: not UTF-8 text (a TOML file is expected)'),
    ('catalog --catalog {deeptoml}', 'catalog file {dir}/in/d.toml: not valid TOML (nested too deeply)'),
    ('sweep {deeptoml}', "sweep file '{dir}/in/d.toml': not valid TOML (nested too deeply)"),
    ('simulate --workload-file {deepjson}', 'd.json: line 1: not valid JSON (nested too deeply; a row is an object'),
    ('trace-stats {deepjson}', 'd.json: line 1: not valid JSON (nested too deeply; a row is an object'),
    ('simulate --workload-file {int64prompt}', 'line 2: prompt length of 9,223,372,036,854,775,808 tokens does not fit a 64-bit'),
    ('simulate --workload-file {hugeoutput}', "request 1's output of 1,000,000,000,000 tokens is above 16,777,216, the most"),
    ('simulate --workload-file {bighash}', 'line 1: hash_ids must be a list of whole numbers that fit a 64-bit integer'),
    ('simulate --max-num-batched-tokens 99999999999999999999', '--max-num-batched-tokens 1e+20 is out of range: 1 to 16,777,216'),
    ('simulate --max-num-batched-tokens 10000000', '--max-num-batched-tokens of 10,000,000 tokens is above 5,903,082, the most'),
    ('capacity --rtol 1e-300', '--rtol 1e-300 is below 1e-06: each halving of the bracket is one more simulation'),
    ('plan --gpus 4 --rtol 1e-9', '--rtol 1e-09 is below 1e-06'),
    ('simulate --model mixtral-8x7b --devices-per-instance 2 --tp 2 --ep 2 --expert-imbalance 1e300',
     '--expert-imbalance 1e+300 is above --ep 2: the busiest of 2 GPUs holds at most all'),
    ('simulate --speculative llama3.2-1b --spec-seed 99999999999999999999',
     'invalid --spec-seed (got 99999999999999999999): Input should be less than or equal to 9223372036854775807'),
    ('simulate --kv-policy paged --kv-block-size 99999999999999999999', '--kv-block-size 1e+20 is out of range: 1 to 16,777,216'),
    ('simulate --kv-policy max --max-seq-len 99999999999999999999', '--max-seq-len 1e+20 is out of range: 1 to 16,777,216'),
    ('simulate --system-prompts 2 --system-len 99999999999999999999', '--system-len 1e+20 is out of range: 0 to 16,777,216'),
    ('simulate --model llama3-8b-ced --ced-replay 99999999999999999999', '--ced-replay 1e+20 is out of range: 1 to 16,777,216'),
    ('simulate --requests 20 --model llama3-8b-hyena --device optical-fft --ft-mask-rate 1e-6',
     'the simulated clock reached 2.96e+09 s, beyond 1e+09 s (about 32 years)'),
    ('simulate --requests 20 --turns 2 --think 1e300', '--think 1e+300 is out of range: 0 to 1,000,000,000 (the clock'),
    ('simulate --requests 20 --turns 2 --think 1e9', 's, beyond 1e+09 s (about 32 years), where float64 seconds'),
    ('simulate --requests 20 --model llama3-8b-hyena --device optical-fft --ft-samples-per-s 1e300',
     'a die of 3e+288 mm² does not fit a 300 mm wafer, so it has no silicon cost'),
    ('handoff --kv-compress fp8 --transit-ops-per-byte 5e-324', '--transit-ops-per-byte 4.94066e-324 is out of range: 1e-06 to 1,0'),
    ('simulate --model llama3-8b-hyena --fft-efficiency 5e-324', '--fft-efficiency 4.94066e-324 is out of range: at least 1e-06'),
    ('simulate --model llama3-8b-hyena --device optical-fft --ft-static-w 1e308', '--ft-static-w 1e+308 is out of range: at most 100,000'),
    ('simulate --model llama3-8b-hyena --device optical-fft --ft-samples-per-s 1e-300', '--ft-samples-per-s 1e-300 is out of range: at least 1'),
    ('simulate --model llama3-8b-hyena --device optical-fft --ft-mask-rate 1e-300', '--ft-mask-rate 1e-300 is out of range: at least 1e-06'),
    ('trace-stats {sametime} --bucket 5e-324', '--bucket 4.94066e-324 is below 1e-06 s: one arrival in it is a rate'),
    ('simulate --kv-compress fp8 --transit-pj-per-bit 1e308', '--transit-pj-per-bit 1e+308 is out of range: at most 1,000,000'),]


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_fixtures(tmp_path_factory.mktemp("bad-inputs"))


def test_the_corpus_is_large_and_covers_every_subcommand() -> None:
    from kvcargo.cli import _register, cli

    _register()
    covered = {argv.split()[0] for argv, _ in CLI_CASES}
    assert set(cli.commands) <= covered
    assert len(CLI_CASES) + len(WEB_SIMULATE_CASES) + len(WEB_HANDOFF_CASES) >= 300
    assert len({argv for argv, _ in CLI_CASES}) == len(CLI_CASES)


@pytest.mark.parametrize("argv, expected", CLI_CASES, ids=[a for a, _ in CLI_CASES])
def test_bad_cli_input_gets_one_line_and_exit_2(argv: str, expected: str, fixtures: dict[str, str],
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    out_dir = Path(fixtures["tmp"])
    monkeypatch.chdir(out_dir)
    with pytest.raises(SystemExit) as exit_info:
        main(shlex.split(argv.format(**fixtures)))
    captured = capsys.readouterr()
    assert exit_info.value.code == 2, captured
    assert captured.out == ""
    # the one-time compile notice may precede the error when the refusal comes from the engine run
    err = "".join(line for line in captured.err.splitlines(keepends=True) if not line.startswith("kvcargo: compiling the simulation engine"))
    assert err.endswith("\n") and err.count("\n") == 1, captured.err
    assert err.startswith("kvcargo") and ": error: " in err
    assert expected in err.replace(os.path.dirname(fixtures["tmp"]), "{dir}"), captured.err
    assert list(out_dir.iterdir()) == []  # nothing written, not even a temporary file


# ------------------------------------------------------------------------------- web API

WEB_SIMULATE_CASES = [
    ({"rate": True}, 422, "invalid --rate (got True): Input should be a valid number"),
    ({"rate": "9"}, 422, "invalid --rate (got '9')"),
    ({"rate": 0}, 422, "invalid --rate (got 0)"),
    ({"rate": -3.5}, 422, "invalid --rate"),
    ({"rate": 1e-300}, 422, "--rate 1e-300 is out of range"),
    ({"rate": 1e300}, 422, "--rate 1e+300 is out of range"),
    ({"rate": [8]}, 422, "invalid --rate"),
    ({"rate": {"v": 8}}, 422, "invalid --rate"),
    ({"requests": True}, 422, "invalid --requests (got True)"),
    ({"requests": "10"}, 422, "invalid --requests (got '10')"),
    ({"requests": 10.0}, 422, "invalid --requests (got 10.0)"),
    ({"requests": 0}, 422, "invalid --requests (got 0)"),
    ({"requests": -1}, 422, "invalid --requests"),
    ({"requests": 50_001}, 422, "at most 50,000 per run in the web API"),
    ({"requests": 10**30}, 422, "at most 50,000 per run in the web API"),
    ({"prompt": 0}, 422, "invalid --prompt"),
    ({"prompt": "2048"}, 422, "invalid --prompt (got '2048')"),
    ({"prompt": False}, 422, "invalid --prompt (got False)"),
    ({"prompt": 1e6, "max_length": 2_000_000}, 422, "invalid --max-length (got 2e+06): at most 1,048,576"),
    ({"output": 0}, 422, "invalid --output"),
    ({"output": 1e9}, 422, "invalid --output (got 1e+09): at most 65,536 in the web API"),
    ({"prompt_cv": -1}, 422, "invalid --prompt-cv"),
    ({"prompt_cv": 1e200}, 422, "--prompt-cv 1e+200 is out of range"),
    ({"output_cv": "0.5"}, 422, "invalid --output-cv (got '0.5')"),
    ({"seed": 1.5}, 422, "invalid --seed"),
    ({"seed": "1"}, 422, "invalid --seed"),
    ({"seed": True}, 422, "invalid --seed"),
    ({"ttft_slo": 0}, 422, "invalid --ttft-slo"),
    ({"tpot_slo": -1}, 422, "invalid --tpot-slo"),
    ({"ttft_slo": 1e12}, 422, "--ttft-slo 1e+12 is out of range"),
    ({"prefill": 0}, 422, "invalid --prefill"),
    ({"prefill": 65}, 422, "invalid --prefill (got 65): at most 64 in the web API"),
    ({"decode": 2.5}, 422, "invalid --decode"),
    ({"instances": 0, "mode": "colocated"}, 422, "invalid --instances"),
    ({"link_channels": 0}, 422, "invalid --link-channels"),
    ({"link_channels": 65}, 422, "at most 64 in the web API"),
    ({"devices_per_instance": 0}, 422, "invalid --devices-per-instance"),
    ({"devices_per_instance": 65}, 422, "at most 64 in the web API"),
    ({"prefill_devices_per_instance": 2000}, 422, "--prefill-devices-per-instance 2000 is out of range"),
    ({"max_batch": 0}, 422, "invalid --max-batch"),
    ({"max_batch": 5000}, 422, "at most 4,096 in the web API"),
    ({"token_budget": 0}, 422, "invalid --token-budget"),
    ({"token_budget": 2_000_000}, 422, "at most 1,048,576 in the web API"),
    ({"power_cap": 50}, 422, "power cap 50 W is not above the static power"),
    ({"power_cap": -1}, 422, "invalid --power-cap"),
    ({"prefill_power_cap": 1e9}, 422, "--prefill-power-cap 1e+09 is out of range"),
    ({"dvfs": 1}, 422, "invalid --dvfs (got 1)"),
    ({"dvfs": "yes"}, 422, "invalid --dvfs"),
    ({"decode_prefix_cache": "true"}, 422, "invalid --decode-prefix-cache"),
    ({"model": 7}, 422, "invalid --model (got 7)"),
    ({"model": "nope"}, 422, "invalid --model: unknown model 'nope'; valid choices:"),
    ({"model": "x" * 50_000}, 422, "(50,002 chars); valid choices:"),
    ({"model": "llama3-70b"}, 422, "does not fit the prefill pool"),
    ({"device": "nope"}, 422, "invalid --device: unknown device 'nope'"),
    ({"prefill_device": "tpu"}, 422, "invalid --prefill-device: unknown device 'tpu'"),
    ({"decode_device": "tpu"}, 422, "invalid --decode-device: unknown device 'tpu'; valid choices:"),
    ({"tp": 1, "scale_up_link": "nope"}, 422, "invalid --scale-up-link: unknown link 'nope'; valid choices:"),
    ({"kv_policy": "paged", "preemption": "swap", "host_link": "nope"}, 422, "invalid --host-link: unknown link 'nope'"),
    ({"speculative": "nope"}, 422, "invalid --speculative: unknown draft 'nope'; valid choices:"),
    ({"model": "mistral-7b-swa", "batch_policy": "chunked"}, 422,
     "the serving levers and sessions are modelled for full-attention models (no sliding window, no MLA); "
     "mistral-7b-swa"),
    ({"model": "deepseek-v3", "devices_per_instance": 16, "workload": "chat"}, 422,
     "the serving levers and sessions are modelled for full-attention models (no sliding window, no MLA); "
     "deepseek-v3"),
    ({"decode_device": ["h100"]}, 422, "invalid --decode-device"),
    ({"link": "carrier-pigeon"}, 422, "invalid --link: unknown link 'carrier-pigeon'"),
    ({"link": None}, 422, "invalid --link"),
    ({"mode": "both"}, 422, "invalid --mode (got 'both')"),
    ({"mode": "colocated", "kv_compress": "fp8"}, 422, "KV compression needs a hand-off"),
    ({"mode": "colocated", "send": "layerwise"}, 422, "they need --mode disagg"),
    ({"kv_compress": "zip"}, 422, "invalid --kv-compress: unknown codec 'zip'"),
    ({"kv_compress_at": "cloud"}, 422, "invalid --kv-compress-at (got 'cloud')"),
    ({"kv_keep": 0.5}, 422, "--kv-keep applies only to --kv-compress freq-keep-k"),
    ({"kv_compress": "freq-keep-k", "kv_keep": 0}, 422, "invalid --kv-keep"),
    ({"kv_compress": "freq-keep-k", "kv_keep": 1e-6}, 422, "--kv-keep 1e-06 is out of range"),
    ({"kv_ratio": 4}, 422, "--kv-ratio needs the ratio codec"),
    ({"kv_compress": "fp8", "kv_ratio": 4}, 422, "--kv-ratio applies only to a 'ratio' codec"),
    ({"kv_compress": "ratio", "kv_ratio": 1e6}, 422, "--kv-ratio 1e+06 is out of range"),
    ({"send": "sideways"}, 422, "invalid --send"),
    ({"layer_groups": 4}, 422, "--layer-groups applies only to --send layerwise"),
    ({"send": "layerwise", "layer_groups": 0}, 422, "invalid --layer-groups"),
    ({"send": "layerwise", "layer_groups": 300}, 422, "at most 256 in the web API"),
    ({"topology": "ring"}, 422, "invalid --topology"),
    ({"nics_per_instance": 4}, 422, "--nics-per-instance applies only to --topology nic"),
    ({"topology": "nic", "nics_per_instance": 0}, 422, "invalid --nics-per-instance"),
    ({"domain_size": 4}, 422, "--domain-size applies only to --topology nvlink-domain"),
    ({"link_sharing": "random"}, 422, "invalid --link-sharing"),
    ({"kv_reserve": "never"}, 422, "invalid --kv-reserve"),
    ({"lm_head": "none"}, 422, "invalid --lm-head"),
    ({"decode_prefix_cache": True}, 422, "--decode-prefix-cache needs prompt block ids"),
    ({"max_length": 0}, 422, "--max-length 0 is out of range"),
    ({"time_scale": 2}, 422, "--time-scale applies only to a trace"),
    ({"limit": 5}, 422, "--limit applies only to a trace"),
    ({"window": "0:10"}, 422, "--window applies only to a trace"),
    ({"time_unit": "ms"}, 422, "--time-unit applies only to a trace"),
    ({"arrival_col": "t"}, 422, "--arrival-col applies only to a trace"),
    ({"workload_file": "/etc/passwd"}, 422, "--workload-file names a file on the server"),
    ({"workload_file": "mooncake-conversation"}, 422, "--workload-file names a file on the server"),
    ({"catalog": ["/etc/passwd"]}, 422, "--catalog names a file on the server"),
    ({"bogus": 1}, 422, "unknown parameter --bogus"),
    ({"x" * 10_000: 1}, 422, "(10,002 chars)"),
    ({"": 1}, 422, "unknown parameter --"),
]
WEB_BODY_CASES = [
    (b"[1, 2]", 400, "the body must be a JSON object of simulation parameters"),
    (b'"rate"', 400, "the body must be a JSON object"),
    (b"42", 400, "the body must be a JSON object"),
    (b"null", 400, "the body must be a JSON object"),
    (b'{"rate": ', 400, "the body is not valid JSON"),
    (b"{'rate': 8}", 400, "the body is not valid JSON"),
    (b'{"rate": NaN}', 422, "invalid --rate (got nan)"),
    (b'{"rate": Infinity}', 422, "invalid --rate (got inf)"),
    (b'{"rate": 1e999}', 422, "invalid --rate (got inf)"),
    (b"\xff\xfe", 400, "the body is not valid JSON"),
    (b"{" + b" " * 70_000 + b"}", 413, "the body is larger than 64 KiB"),
]
WEB_HANDOFF_CASES = [
    ("prompt=0", "invalid --prompt (got '0')"),
    ("prompt=-5", "invalid --prompt"),
    ("prompt=1.5", "invalid --prompt"),
    ("prompt=abc", "invalid --prompt"),
    ("prompt=6000000", "--prompt of 6,000,000 tokens is above 5,903,082"),
    ("prompt=99999999999", "invalid --prompt"),
    ("prompt=1e3", "invalid --prompt"),
    ("prompt=", "invalid --prompt"),
    ("prompt=1&prompt=2", "parameter prompt given more than once"),
    ("model=nope", "unknown model 'nope'"),
    ("model=" + "y" * 50_000, "(50,002 chars); valid choices:"),
    ("link=nope", "invalid --link: unknown link 'nope'"),
    ("device=nope", "invalid --device: unknown device 'nope'"),
    ("speculative=nope", "invalid --speculative: unknown draft 'nope'; valid choices:"),
    ("devices_per_instance=0", "invalid --devices-per-instance"),
    ("devices_per_instance=2000", "invalid --devices-per-instance"),
    ("kv_compress=nope", "invalid --kv-compress: unknown codec 'nope'"),
    ("kv_keep=0.5", "--kv-keep needs a codec"),
    ("kv_ratio=3", "--kv-ratio needs a codec"),
    ("kv_compress=fp8&kv_ratio=3", "--kv-ratio applies only to a 'ratio' codec"),
    ("kv_compress=freq-keep-k&kv_keep=0", "invalid --kv-keep"),
    ("kv_compress=freq-keep-k&kv_keep=nan", "invalid --kv-keep"),
    ("kv_compress=freq-keep-k&kv_keep=1e-9", "--kv-keep 1e-09 is out of range"),
    ("kv_compress=ratio&kv_ratio=inf", "invalid --kv-ratio"),
    ("kv_compress=ratio&kv_ratio=0.5", "invalid --kv-ratio"),
    ("kv_compress=ratio&kv_ratio=1e9", "--kv-ratio 1e+09 is out of range"),
    ("send=sideways", "invalid --send"),
    ("links=1", "unknown parameter --links"),
    ("bogus=1", "unknown parameter --bogus"),
    ("model=llama3-70b&device=a100-40g", "does not fit the prefill pool"),
]


@pytest.fixture(scope="module")
def client():
    """The web app with no simulation worker at all: every bad request must be answered by the
    request handler itself (a worker starting, busy or replaced must never decide a 4xx)."""
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from kvcargo.web.app import create_app
    from kvcargo.web.workers import WorkerFailed

    async def no_worker(job: dict) -> None:
        raise WorkerFailed("a bad request reached a simulation worker")

    app = create_app(max_requests=50_000, timeout_s=60)
    app.state.pool.warm = lambda: None
    app.state.pool.run = no_worker
    with TestClient(app) as c:
        yield c


def _one_line_error(r, status: int, expected: str) -> None:
    assert r.status_code == status, r.text[:300]
    body = r.json()
    assert set(body) <= {"error", "field"} and "\n" not in body["error"], body
    assert expected in body["error"], body
    assert len(body["error"]) < 600  # one line: an unknown key lists every valid choice


@pytest.mark.parametrize("body, status, expected", WEB_SIMULATE_CASES, ids=[str(b)[:50] for b, _, _ in WEB_SIMULATE_CASES])
def test_bad_simulation_parameters_get_a_4xx_json_line(client, body: dict, status: int, expected: str) -> None:
    _one_line_error(client.post("/api/simulate", json=body), status, expected)


@pytest.mark.parametrize("raw, status, expected", WEB_BODY_CASES, ids=[repr(b[:20]) for b, _, _ in WEB_BODY_CASES])
def test_malformed_simulation_bodies_get_a_4xx_json_line(client, raw: bytes, status: int, expected: str) -> None:
    r = client.post("/api/simulate", content=raw, headers={"Content-Type": "application/json"})
    _one_line_error(r, status, expected)


@pytest.mark.parametrize("query, expected", WEB_HANDOFF_CASES, ids=[q[:50] for q, _ in WEB_HANDOFF_CASES])
def test_bad_calculator_queries_get_a_422_json_line(client, query: str, expected: str) -> None:
    _one_line_error(client.get("/api/handoff?" + query), 422, expected)


def test_an_unknown_catalog_key_names_its_parameter(client) -> None:
    """Every parameter that names a catalog entry, on both endpoints: 422 from the handler (no
    worker here), the parameter in ``field`` (the page marks it and shows its label) and the choices."""
    from kvcargo.params import HandoffConfig
    from kvcargo.web.checks import CATALOG_FIELDS

    for name in CATALOG_FIELDS:
        r = client.post("/api/simulate", json={name: "nope"} | ({"tp": 1} if name == "scale_up_link" else {})
                        | ({"kv_policy": "paged", "preemption": "swap"} if name == "host_link" else {}))
        _one_line_error(r, 422, f"invalid --{name.replace('_', '-')}: unknown ")
        assert r.json()["field"] == name and "; valid choices: " in r.json()["error"]
        if name in HandoffConfig.model_fields:
            r = client.get(f"/api/handoff?{name}=nope")
            _one_line_error(r, 422, f"invalid --{name.replace('_', '-')}: unknown ")
            assert r.json()["field"] == name


def test_the_command_alone_shows_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    """``kvcargo`` with nothing to do prints the help as click lays it out (exit 2, as click does),
    not folded into one error line."""
    with pytest.raises(SystemExit) as exit_info:
        main([])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("Usage: kvcargo [OPTIONS] COMMAND [ARGS]...\n")
    assert "\nCommands:\n" in err and "  simulate " in err and "error" not in err.splitlines()[0]
