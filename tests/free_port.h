// A TCP port for a test's rendezvous that no other process is listening on.
// Ports made from the process id collided when ctest ran two test processes
// at once (one bound 37840 while the other's formula also gave 37840); the
// kernel's choice for port 0 is free now and is not handed out again soon.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace bigbatch::testing_support {

inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("free_port: socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    throw std::runtime_error("free_port: bind to 127.0.0.1:0: " + why);
  }
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace bigbatch::testing_support
