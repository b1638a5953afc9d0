from loopwire import agent_tool, run_worker

researcher = agent_tool(
    "researcher",
    model="demo",
    tools=["calculator"],
    instructions="You research with the calculator.",
    description="Research a question; answers with what it found.",
)

if __name__ == "__main__":
    run_worker([researcher])
