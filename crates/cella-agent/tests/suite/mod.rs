mod bench;
mod limits;
mod support;
mod tool_loop;
mod wire;
