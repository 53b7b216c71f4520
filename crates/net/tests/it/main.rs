//! Integration tests of the listeners: real sockets on 127.0.0.1:0.

mod slow_clients;
