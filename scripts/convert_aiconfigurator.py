"""Rebuild kvcargo's built-in kernel tables from an unpacked aiconfigurator-core wheel (needs pyarrow).

    pip download --no-deps aiconfigurator-core && unzip aiconfigurator_core-*.whl -d aic
    python scripts/convert_aiconfigurator.py aic/aiconfigurator_core/systems/data

See kvcargo/aiconfigurator_import.py for what is converted and held out.
"""

from kvcargo.aiconfigurator_import import main

if __name__ == "__main__":
    main()
