import os
import platform

print(f"hello from task {os.environ.get('TACC_TASK_ID')} on {platform.node()} (python {platform.python_version()})")
