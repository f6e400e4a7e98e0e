//! Agent Skills (agentskills.io). Work in progress.
