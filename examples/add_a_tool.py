import msgspec

from loopwire import run_worker, tool


class Shout(msgspec.Struct):
    text: str


@tool(description="Upper-case a text and add an exclamation mark.")
def shout(args: Shout) -> str:
    return args.text.upper() + "!"


if __name__ == "__main__":
    run_worker([shout])
